package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// inventoryAddresses is the Stack's inventory: from its status, or from
// the Secret it names when the inventory is too large for the status.
func inventoryAddresses(ctx context.Context, k *kube, st *terracev1.Stack) ([]string, error) {
	inv := st.Status.Inventory
	if inv == nil || inv.SecretRef == nil {
		if inv == nil {
			return nil, nil
		}
		return inv.Resources, nil
	}
	var sec corev1.Secret
	if err := k.client.Get(ctx, client.ObjectKey{Namespace: st.Namespace, Name: inv.SecretRef.Name}, &sec); err != nil {
		return nil, fmt.Errorf("failed to read the inventory Secret %s: %v", inv.SecretRef.Name, err)
	}
	return strings.Fields(string(sec.Data["resources"])), nil
}

// printPolicyAndInventory prints the backend lock a run met, the plan
// policies' decision (as stored with the plan, else as the status has
// it), the latest release's health checks and the inventory.
func printPolicyAndInventory(out io.Writer, d *description) {
	st := d.Stack
	if l := st.Status.BackendLock; l != nil {
		fmt.Fprintf(out, "State lock (spec.backend): a run met it at %s; Terrace never releases a lock in the Stack's own backend: once its holder is gone, run `tofu force-unlock <ID>` against the backend\n", l.ObservedAt.UTC().Format(time.RFC3339))
		fmt.Fprintf(out, "  %s\n", oneLine(l.Message))
	}
	var lines []string
	title := "Plan policy"
	if rec := d.StoredPlan; rec != nil && rec.Policy != nil {
		lines, title = stackview.PolicyLines(rec.Policy), "Plan policy (stored with plan "+rec.Key.ID+")"
	} else if p := st.Status.Plan; p != nil && p.Policy != nil {
		lines = stackview.PolicyLines(stackview.StatusPolicy(p.Policy))
	}
	for i, line := range lines {
		if i == 0 {
			fmt.Fprintf(out, "%s: %s\n", title, line)
			continue
		}
		fmt.Fprintf(out, "  %s\n", oneLine(line))
	}
	if n := len(d.Releases); n > 0 && len(d.Releases[n-1].HealthChecks) > 0 {
		checks := d.Releases[n-1].HealthChecks
		section(out, fmt.Sprintf("Health checks (release %d)", d.Releases[n-1].Revision), len(checks), func(tw *tabwriter.Writer) {
			fmt.Fprintln(tw, "  NAME\tPASSED\tMESSAGE")
			for _, c := range checks {
				fmt.Fprintf(tw, "  %s\t%t\t%s\n", c.Name, c.Passed, oneLine(c.Message))
			}
		})
	}
	if st.Status.Inventory == nil {
		return
	}
	section(out, fmt.Sprintf("Inventory (%d resources)", st.Status.Inventory.Count), len(d.Inventory), func(tw *tabwriter.Writer) {
		for _, a := range d.Inventory {
			fmt.Fprintf(tw, "  %s\n", a)
		}
	})
}
