package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// statusColumnWidth keeps a row of `terrace get -A` under 160 columns for
// ordinary names; -o wide, describe and -o yaml show the whole message.
const statusColumnWidth = 64

func newGetCommand() *cobra.Command {
	var allNamespaces, watchFlag bool
	var output string
	cmd := &cobra.Command{
		Use:   "get [STACK]",
		Short: "List Stacks with their readiness, pending plan and applied revision",
		Example: "  terrace get -n team\n" +
			"  terrace get web -n team -o yaml\n" +
			"  terrace get -A\n" +
			"  terrace get -w -n team",
		Args: cobra.MaximumNArgs(1),
	}
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "list the Stacks of every namespace")
	cmd.Flags().BoolVarP(&watchFlag, "watch", "w", false, "after the list, print a row for every change until Ctrl-C (table output only)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: wide (full messages and digests), yaml or json (default: a table)")
	return userCommand(cmd, func(ctx context.Context, k *kube, s streams, args []string) error {
		if err := checkOutputFormat(output, "wide", "yaml", "json"); err != nil {
			return err
		}
		if watchFlag && (output == "yaml" || output == "json") {
			return fmt.Errorf("--watch prints table rows: use it without -o %s, or with -o wide", output)
		}
		resourceVersion := ""
		var stacks []terracev1.Stack
		if len(args) == 1 {
			if allNamespaces {
				return fmt.Errorf("a Stack name and --all-namespaces do not go together: name the namespace with -n")
			}
			stack, err := k.stack(ctx, args[0])
			if err != nil {
				return err
			}
			stacks = []terracev1.Stack{*stack}
			resourceVersion = stack.ResourceVersion
		} else {
			list := &terracev1.StackList{}
			var opts []client.ListOption
			where := "any namespace"
			if !allNamespaces {
				opts = append(opts, client.InNamespace(k.namespace))
				where = "namespace " + k.namespace
			}
			if err := k.client.List(ctx, list, opts...); err != nil {
				return describeAPIError(err, "Stacks in "+where, k.namespace)
			}
			stacks = list.Items
			resourceVersion = list.ResourceVersion
			if len(stacks) == 0 && (output == "" || output == "wide") && !watchFlag {
				fmt.Fprintf(s.err, "No Stacks found in %s.\n", where)
				return nil
			}
		}
		sort.Slice(stacks, func(i, j int) bool {
			if stacks[i].Namespace != stacks[j].Namespace {
				return stacks[i].Namespace < stacks[j].Namespace
			}
			return stacks[i].Name < stacks[j].Name
		})
		if output == "yaml" || output == "json" {
			return printStacks(s.out, stacks, output, len(args) == 1)
		}
		if err := printStackTable(s.out, stacks, allNamespaces, output == "wide", time.Now()); err != nil || !watchFlag {
			return err
		}
		w := stackWatch{namespace: k.namespace, allNamespaces: allNamespaces, resourceVersion: resourceVersion, wide: output == "wide"}
		if len(args) == 1 {
			w.name = args[0]
		}
		return w.run(ctx, k, s.out)
	})
}

// checkOutputFormat refuses an -o value the verb does not know.
func checkOutputFormat(output string, allowed ...string) error {
	if output == "" {
		return nil
	}
	for _, a := range allowed {
		if output == a {
			return nil
		}
	}
	return fmt.Errorf("unknown output format %q: use %s", output, strings.Join(allowed, " or "))
}

// printStackTable prints the columns of the CRD's printer columns, with
// short digests (1@sha256:e3f62017) unless wide.
func printStackTable(out io.Writer, stacks []terracev1.Stack, withNamespace, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	header := "NAME\tREADY\tSTATUS\tPLAN\tREVISION\tAGE"
	if withNamespace {
		header = "NAMESPACE\t" + header
	}
	fmt.Fprintln(tw, header)
	for i := range stacks {
		fmt.Fprintln(tw, tableRow(stackRow(&stacks[i], withNamespace, wide, now)))
	}
	return tw.Flush()
}

// stackRow is one Stack's cells of the get table.
func stackRow(st *terracev1.Stack, withNamespace, wide bool, now time.Time) []string {
	ready, message := "Unknown", ""
	if c := stackview.Condition(st, terracev1.ReadyCondition); c != nil {
		ready, message = string(c.Status), c.Message
		// True only as kstatus reads it: for this generation, nothing in progress.
		if atGeneration, why, _ := readiness.ReadyAtGeneration(st); stackview.IsTrue(c) && !atGeneration {
			ready, message = string(metav1.ConditionUnknown), why
		}
	}
	if st.Spec.Suspend {
		message = "suspended; " + message
	}
	message, revision := oneLine(message), st.Status.LastAppliedRevision
	if !wide {
		message = truncate(stackview.ShortRevision(message), statusColumnWidth)
		revision = stackview.ShortRevision(revision)
	}
	row := []string{st.Name, ready, message, stackview.PendingPlan(st), revision, age(st.CreationTimestamp, now)}
	if withNamespace {
		row = append([]string{st.Namespace}, row...)
	}
	return row
}

// printStacks writes one Stack, or a StackList, as YAML or JSON, without
// managedFields (as kubectl does).
func printStacks(out io.Writer, stacks []terracev1.Stack, format string, single bool) error {
	for i := range stacks {
		stacks[i].ManagedFields = nil
		stacks[i].APIVersion, stacks[i].Kind = terracev1.GroupVersion.String(), "Stack"
	}
	var obj any = &terracev1.StackList{TypeMeta: metav1.TypeMeta{APIVersion: terracev1.GroupVersion.String(), Kind: "StackList"}, Items: stacks}
	if single {
		obj = &stacks[0]
	}
	return writeFormatted(out, obj, format)
}

// writeFormatted writes v as indented JSON or as YAML.
func writeFormatted(out io.Writer, v any, format string) error {
	var data []byte
	var err error
	if format == "yaml" {
		data, err = yaml.Marshal(v)
	} else {
		data, err = json.MarshalIndent(v, "", "  ")
		data = append(data, '\n')
	}
	if err != nil {
		return fmt.Errorf("failed to encode the output: %w", err)
	}
	_, err = out.Write(data)
	return err
}

func age(created metav1.Time, now time.Time) string {
	if created.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(created.Time))
}

// tableRow joins cells for a tabwriter, showing an empty cell as "-".
func tableRow(cells []string) string {
	for i, cell := range cells {
		if cell == "" {
			cells[i] = "-"
		}
	}
	return strings.Join(cells, "\t")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func truncate(s string, limit int) string {
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	return string([]rune(s)[:limit-3]) + "..."
}
