// Package cli assembles the terrace command tree. Each subcommand lives in
// its own file and stays thin: it binds flags and calls into internal/.
package cli

import (
	"github.com/spf13/cobra"

	"github.com/terrace-dev/terrace/internal/runnercmd"
)

// NewRootCommand returns the terrace command with every subcommand attached.
// Installed as kubectl-terrace it also works as a kubectl plugin.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "terrace",
		Short:         "Run OpenTofu/Terraform stacks declared as Kubernetes resources",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand())
	root.AddCommand(runnercmd.NewCommand("runner"))
	root.AddCommand(newDevCommand())
	root.AddCommand(newControllerCommand())
	root.AddCommand(newStateCommand())
	root.AddCommand(newImportCommand())
	root.AddCommand(newAPICommand())
	root.AddCommand(withAPI(newGetCommand(), apiGet), withAPI(newPlanCommand(), apiPlan), withAPI(newApproveCommand(), apiApprove),
		withAPI(newOutputsCommand(), apiOutputs), withAPI(newHistoryCommand(), apiHistory),
		newLogsCommand(), newReconcileCommand(), newSuspendCommand(), newResumeCommand(),
		newDescribeCommand(), newReplanCommand(), newForceUnlockCommand(), newPushStateCommand())
	return root
}
