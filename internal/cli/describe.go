package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// describeRuns is how many of the latest releases describe lists.
const describeRuns = 5

// description is everything describe shows; -o json|yaml prints it whole.
type description struct {
	Stack    *terracev1.Stack  `json:"stack"`
	Releases []release.Release `json:"releases"`
	Events   []describedEvent  `json:"events"`
	// Inventory is every resource address in the state.
	Inventory []string `json:"inventory,omitempty"`
	// StoredPlan is the shown plan's record in the plan store (its
	// policy decision), when it is stored.
	StoredPlan *state.PlanMeta `json:"storedPlan,omitempty"`
	// Notes say what could not be read (a store, the events).
	Notes []string `json:"notes,omitempty"`
}

type describedEvent struct {
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
	Last    time.Time `json:"last"`
}

func newDescribeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe STACK",
		Short: "Show a Stack in full: source, conditions, pending plan, last runs with their times, events",
		Long: "Shows what a person on call needs about one Stack: its source and settings, every condition, the\n" +
			"pending plan, the latest releases (runs that applied) with their start and end times, the runner\n" +
			"pods and the Stack's events. Digests are shown in full.",
		Example: "  terrace describe web -n team\n  terrace describe web -o yaml",
		Args:    cobra.ExactArgs(1),
	}
	return stackVerb(cmd, "output format: json or yaml (default: text)", []string{"json", "yaml"}, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, output string) error {
		d := gatherDescription(ctx, k, stack)
		if output != "" {
			stack.ManagedFields = nil
			stack.APIVersion, stack.Kind = terracev1.GroupVersion.String(), "Stack"
			return writeFormatted(s.out, d, output)
		}
		return printDescription(s.out, d, time.Now())
	})
}

// gatherDescription reads releases and events; what cannot be read becomes a note.
func gatherDescription(ctx context.Context, k *kube, stack *terracev1.Stack) *description {
	d := &description{Stack: stack, Releases: []release.Release{}, Events: []describedEvent{}}
	if set, closeStores, err := k.stores(ctx); err != nil {
		d.Notes = append(d.Notes, err.Error())
	} else {
		releases, err := set.History.List(ctx, stack.Namespace, stack.Name)
		if id := stackview.ShownPlan(stack); id != "" {
			d.StoredPlan, _ = stackview.StoredPlan(ctx, set.Plans, stack, id)
		}
		closeStores()
		if err != nil {
			d.Notes = append(d.Notes, fmt.Sprintf("failed to list the releases: %v", err))
		}
		if n := len(releases); n > describeRuns {
			releases = releases[n-describeRuns:]
		}
		for _, r := range releases {
			r.Outputs = release.Redacted(r.Outputs)
			d.Releases = append(d.Releases, r)
		}
	}
	events := &corev1.EventList{}
	err := k.client.List(ctx, events, client.InNamespace(stack.Namespace),
		client.MatchingFields{"involvedObject.kind": "Stack", "involvedObject.name": stack.Name})
	if err != nil {
		d.Notes = append(d.Notes, fmt.Sprintf("failed to list the events: %v", err))
	}
	for _, e := range events.Items {
		last := e.LastTimestamp.Time
		if e.Series != nil {
			last = e.Series.LastObservedTime.Time
		}
		if last.IsZero() {
			last = e.EventTime.Time
		}
		d.Events = append(d.Events, describedEvent{Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count, Last: last})
	}
	sort.SliceStable(d.Events, func(i, j int) bool { return d.Events[i].Last.Before(d.Events[j].Last) })
	if d.Inventory, err = inventoryAddresses(ctx, k, stack); err != nil {
		d.Notes = append(d.Notes, err.Error())
	}
	return d
}

func printDescription(out io.Writer, d *description, now time.Time) error {
	st := d.Stack
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	field := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", name, value)
		}
	}
	field("Name", st.Name)
	field("Namespace", st.Namespace)
	field("Source", sourceText(st))
	field("Path", st.Spec.Path)
	field("Workspace", workspaceOf(st))
	field("Approve plan", valueOr(st.Spec.ApprovePlan, "(empty: every plan waits for approval)"))
	field("Suspended", map[bool]string{true: "yes", false: ""}[st.Spec.Suspend])
	field("Generation", fmt.Sprintf("%d (observed %d)", st.Generation, st.Status.ObservedGeneration))
	if health, why, err := readiness.Compute(st); err == nil {
		// What Flux, Argo CD and kubectl wait make of the Stack.
		field("kstatus", fmt.Sprintf("%s: %s", health, oneLine(why)))
	}
	field("Git commit", gitCommitText(st.Status.Git, now))
	field("Applied revision", st.Status.LastAppliedRevision)
	field("Attempted revision", st.Status.LastAttemptedRevision)
	field("Planned revision", st.Status.LastPlannedRevision)
	if r := st.Status.Release; r != nil {
		field("Release", fmt.Sprintf("%d (%s)", r.Revision, r.Status))
	}
	field("Outputs", strings.Join(st.Status.Outputs, ", "))
	if st.Status.LastDriftCheckAt != nil {
		field("Last drift check", fmt.Sprintf("%s ago", age(*st.Status.LastDriftCheckAt, now)))
	}
	if p := st.Status.Plan; p != nil && p.ID != "" {
		plan := fmt.Sprintf("%s (%s)", p.ID, stackview.PlanCounts(p))
		if p.Pending != "" {
			plan += ", awaiting approval: terrace approve " + st.Name + " " + p.Pending + " -n " + st.Namespace
		}
		field("Plan", plan)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	section(out, "Conditions", len(st.Status.Conditions), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
		for _, c := range st.Status.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, age(c.LastTransitionTime, now), oneLine(c.Message))
		}
	})
	printPullRequests(out, st, now)
	printPolicyAndInventory(out, d)
	section(out, "Last runs (releases)", len(d.Releases), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "  REVISION\tSTATUS\tSOURCE REVISION\tPLAN\tSTARTED\tDURATION\tTOOL")
		for _, r := range d.Releases {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t+%d ~%d -%d\t%s\t%s\t%s\n", r.Revision, r.Status, r.SourceRevision,
				r.Plan.Add, r.Plan.Change, r.Plan.Destroy, timestamp(r.StartedAt), runDuration(r), valueOr(r.ToolVersion, "-"))
		}
	})
	section(out, "Events", len(d.Events), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "  TYPE\tREASON\tAGE\tMESSAGE")
		for _, e := range d.Events {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Type, e.Reason, age(metav1.NewTime(e.Last), now), oneLine(e.Message))
		}
	})
	for _, n := range d.Notes {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	return nil
}

// section prints a titled table, or "<none>" when it has no rows.
func section(out io.Writer, title string, rows int, body func(*tabwriter.Writer)) {
	if rows == 0 {
		fmt.Fprintf(out, "%s: <none>\n", title)
		return
	}
	fmt.Fprintf(out, "%s:\n", title)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	body(tw)
	_ = tw.Flush()
}

func sourceText(st *terracev1.Stack) string {
	src := st.Spec.Source
	switch {
	case src.ProgramRef != nil:
		return "Program " + src.ProgramRef.Name
	case src.SourceRef != nil:
		ns := src.SourceRef.Namespace
		if ns == "" {
			ns = st.Namespace
		}
		return fmt.Sprintf("%s %s/%s", src.SourceRef.Kind, ns, src.SourceRef.Name)
	case src.URL != "":
		return src.URL + " (" + src.Digest + ")"
	case src.Git != nil:
		return "Git " + src.Git.URL + " " + gitRefText(src.Git.Ref)
	}
	return ""
}

// gitRefText is the ref a Git source follows, as the user set it.
func gitRefText(ref *terracev1.GitRef) string {
	switch {
	case ref == nil:
		return "branch main"
	case ref.Tag != "":
		return "tag " + ref.Tag
	case ref.SemVer != "":
		return "semver " + ref.SemVer
	case ref.Commit != "" && ref.Branch != "":
		return "commit " + ref.Commit + " on branch " + ref.Branch
	case ref.Commit != "":
		return "commit " + ref.Commit
	default:
		return "branch " + valueOr(ref.Branch, "main")
	}
}

// gitCommitText is the commit a Git source resolved to, with its message.
func gitCommitText(g *terracev1.GitStatus, now time.Time) string {
	if g == nil || g.Revision == "" {
		return ""
	}
	text := g.Revision
	if g.Message != "" {
		text += " " + strconv.Quote(g.Message)
	}
	if g.Author != "" {
		text += " by " + g.Author
	}
	if g.CommittedAt != nil {
		text += ", " + age(*g.CommittedAt, now) + " ago"
	}
	return text
}

// printPullRequests lists the plans of the Stack's open pull requests.
func printPullRequests(out io.Writer, st *terracev1.Stack, now time.Time) {
	if st.Spec.Source.Git == nil || st.Spec.Source.Git.PullRequests == nil || !st.Spec.Source.Git.PullRequests.Enabled {
		return
	}
	section(out, "Pull request plans", len(st.Status.PullRequests), func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "  PULL REQUEST\tHEAD\tSTATUS\tPLAN\tPLANNED\tURL\tMESSAGE")
		for _, p := range st.Status.PullRequests {
			planned := "-"
			if p.PlannedAt != nil {
				planned = age(*p.PlannedAt, now) + " ago"
			}
			fmt.Fprintf(tw, "  #%d %s\t%s\t%s\t+%d ~%d -%d\t%s\t%s\t%s\n", p.Number, oneLine(p.Title), p.HeadRevision, valueOr(p.Status, "Pending"),
				p.Add, p.Change, p.Destroy, planned, p.URL, oneLine(p.Message))
		}
	})
}

func runDuration(r release.Release) string {
	if r.StartedAt.IsZero() || r.FinishedAt.IsZero() {
		return "-"
	}
	return r.FinishedAt.Sub(r.StartedAt).Round(100 * time.Millisecond).String()
}

func valueOr(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}
