package operator

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// SystemNamespaces are Kubernetes' own namespaces. The namespaced install
// mode exists to keep the controller's rights out of them, so
// --watch-namespaces refuses them rather than bind a Secrets-writing role
// next to the cluster's own credentials.
var SystemNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// WatchedNamespaces returns the namespaces the controller is restricted
// to, sorted, with Namespace among them; nil means every namespace
// (WatchNamespaces empty). It refuses a system namespace, in the list or as
// the operator's own, and a name that cannot be a namespace's, so a wrong
// list stops the controller at its start with the reason.
func (o Options) WatchedNamespaces() ([]string, error) {
	if len(o.WatchNamespaces) == 0 {
		return nil, nil
	}
	if slices.Contains(SystemNamespaces, o.Namespace) {
		return nil, fmt.Errorf("--watch-namespaces: the operator runs in %s, a system namespace, and is always watched there: install Terrace in a namespace of its own (e.g. terrace-system) to keep it out of %s", o.Namespace, strings.Join(SystemNamespaces, ", "))
	}
	out := []string{o.Namespace}
	for _, ns := range o.WatchNamespaces {
		switch {
		case ns == "":
			return nil, fmt.Errorf("--watch-namespaces %q: an empty name; list namespaces separated by commas", strings.Join(o.WatchNamespaces, ","))
		case slices.Contains(SystemNamespaces, ns):
			return nil, fmt.Errorf("--watch-namespaces: %s is a system namespace: the namespaced mode keeps the controller's rights (Secrets, pods, Roles) out of %s; remove it from the list", ns, strings.Join(SystemNamespaces, ", "))
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		out = append(out, ns)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
