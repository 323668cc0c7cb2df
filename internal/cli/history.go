package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state/release"
)

func newHistoryCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "history STACK",
		Short: "List the Stack's release records, oldest first",
		Long: "Lists the release records of the Stack from the namespace's release store (Secrets or PostgreSQL,\n" +
			"as its TerraceConfig says): one per apply, with the source revision, plan counts, times and tool version.",
		Example: "  terrace history web -n team\n  terrace history web -o json",
		Args:    cobra.ExactArgs(1),
	}
	return stackVerb(cmd, "output format: json or yaml (default: a table)", []string{"json", "yaml"}, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, output string) error {
		set, closeStores, err := k.stores(ctx)
		if err != nil {
			return err
		}
		defer closeStores()
		releases, err := set.History.List(ctx, stack.Namespace, stack.Name)
		if err != nil {
			return fmt.Errorf("failed to list the releases of Stack %s/%s: %w", stack.Namespace, stack.Name, err)
		}
		if output != "" {
			if releases == nil {
				releases = []release.Release{}
			}
			return writeFormatted(s.out, releases, output)
		}
		if len(releases) == 0 {
			fmt.Fprintf(s.err, "Stack %s/%s has no releases yet: one is recorded per apply.\n", stack.Namespace, stack.Name)
			return nil
		}
		return printHistory(s.out, releases)
	})
}

func printHistory(out io.Writer, releases []release.Release) error {
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "REVISION\tSTATUS\tSOURCE REVISION\tPLAN\tSTARTED\tFINISHED\tTOOL VERSION\tMESSAGE")
	for _, r := range releases {
		row := []string{
			fmt.Sprint(r.Revision), string(r.Status), r.SourceRevision,
			fmt.Sprintf("+%d ~%d -%d", r.Plan.Add, r.Plan.Change, r.Plan.Destroy),
			timestamp(r.StartedAt), timestamp(r.FinishedAt), r.ToolVersion, truncate(oneLine(r.Message), statusColumnWidth),
		}
		fmt.Fprintln(tw, tableRow(row))
	}
	return tw.Flush()
}

func timestamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
