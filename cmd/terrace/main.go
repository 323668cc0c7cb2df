// Command terrace is the single Terrace binary: controller, runner, API
// server, local dev cluster and the user verbs.
package main

import (
	"fmt"
	"os"

	"github.com/terrace-dev/terrace/internal/cli"
)

func main() {
	if err := cli.NewRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
