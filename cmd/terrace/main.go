// Command terrace is the single Terrace binary: controller, runner, API
// server, local dev cluster and the user verbs.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/terrace-dev/terrace/internal/cli"
	"github.com/terrace-dev/terrace/internal/runnerbin"
	"github.com/terrace-dev/terrace/internal/runnercmd"
)

func main() {
	if err := command(os.Args[0]).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// command is what the binary started as argv0 runs.
func command(argv0 string) *cobra.Command {
	if filepath.Base(argv0) != runnerbin.Name {
		return cli.NewRootCommand()
	}
	// Started as terrace-runner (a link to terrace in an image built
	// without the lean binary): the runner, as terrace-runner would be.
	return runnercmd.NewRoot()
}
