// Command terrace-runner is what runner pods start: `terrace runner` as a
// binary of its own, linking only the runner, tofu's executor and the PKI,
// and no Kubernetes client (deps_test.go), so that each run's process starts
// with a fifth of the work and memory of the controller's binary.
package main

import (
	"fmt"
	"os"

	"github.com/terrace-dev/terrace/internal/runnercmd"
)

func main() {
	if err := runnercmd.NewRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
