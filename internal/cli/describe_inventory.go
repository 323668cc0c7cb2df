package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
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

// printPolicyAndInventory prints the plan policies' decision, the latest
// release's health checks and the inventory.
func printPolicyAndInventory(out io.Writer, d *description) {
	st := d.Stack
	if p := st.Status.Plan; p != nil && p.Policy != nil {
		fmt.Fprintf(out, "Plan policy: %s (%s)\n", p.Policy.Decision, p.Policy.PoliciesDigest)
		for _, v := range p.Policy.Violations {
			fmt.Fprintf(out, "  deny: %s\n", oneLine(v))
		}
		for _, w := range p.Policy.Warnings {
			fmt.Fprintf(out, "  warn: %s\n", oneLine(w))
		}
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
