package stack

import (
	"context"
	"fmt"
	"strings"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// RunnerObjectForbiddenReason: spec.runner names a Secret, ConfigMap,
// claim or token that the runner's ServiceAccount may not get itself, so
// no runner pod is made with it; nothing runs until the Stack or the
// namespace's RBAC changes.
const RunnerObjectForbiddenReason = "RunnerObjectForbidden"

// checkRunnerAccess holds spec.runner to the rule varsFrom keeps: the
// kubelet hands a pod the Secrets, ConfigMaps and claims its spec names
// whatever the pod's ServiceAccount may read, so before any pod is made,
// each one is put to a SubjectAccessReview for that ServiceAccount (as
// the kubelet would need it: get, or create serviceaccounts/token for a
// token of another audience). Asked before every run, uncached, like
// varsFrom: a revoked grant counts at once.
//
// The review is the runner ServiceAccount's, not the Stack author's. The
// controller cannot know who wrote a Stack (nothing records the user of a
// create or update, and a Stack has many writers), and the runner pod
// carries that ServiceAccount's token: module code can already get
// whatever the account may get, so a pod spec that names only such
// objects hands the author nothing new. Which accounts a Stack may run as
// is the runner policy's (only the namespace's default runner account
// unless a TerraceConfig lists more): whoever may create Stacks in a
// namespace acts with the rights of those accounts, as they would with
// pods/create (docs/security.md).
func (r *Reconciler) checkRunnerAccess(ctx context.Context, s *scope) error {
	ns, sa := s.stack.Namespace, runnerServiceAccount(s)
	var denied []runnerpolicy.Reference
	refs := runnerpolicy.References(s.stack.Spec.Runner, sa)
	if g := s.stack.Spec.Source.Git; g != nil && g.SecretRef != nil {
		// Mounted in the runner pod by the launcher: module code can read
		// it there, so it is held to the same rule as a Secret volume.
		refs = append(refs, runnerpolicy.Reference{
			Access: runnerpolicy.Access{Verb: "get", Resource: "secrets", Name: g.SecretRef.Name},
			Fields: []string{"spec.source.git.secretRef"},
		})
	}
	for _, ref := range refs {
		allowed, err := r.serviceAccountMay(ctx, sa, ns, ref.Access)
		if err != nil {
			return err
		}
		if !allowed {
			denied = append(denied, ref)
		}
	}
	if len(denied) == 0 {
		return nil
	}
	return outcome.Terminal(RunnerObjectForbiddenReason, runnerAccessError(ns, sa, denied))
}

// runnerAccessError names each refused object, the fields that name it,
// and how to grant the first: the same answer whether or not an object
// exists, since none is read.
func runnerAccessError(ns, sa string, denied []runnerpolicy.Reference) error {
	parts := make([]string, len(denied))
	for i, d := range denied {
		a := d.Access
		parts[i] = fmt.Sprintf("%s: %s %s/%s (%s %s)", strings.Join(d.Fields, ", "), a.Kind(), ns, a.Name, a.Verb, a.ResourceName())
	}
	first := denied[0].Access
	role := "runner-" + first.Verb + "-" + first.Name
	return fmt.Errorf("ServiceAccount %s, which the Stack's runner runs as, may not itself read what the Stack would put into the runner pod, "+
		"so no runner pod is made: %s. Grant it with a Role and RoleBinding "+
		"(kubectl -n %s create role %s --verb=%s --resource=%s --resource-name=%s; kubectl -n %s create rolebinding %s --role=%s --serviceaccount=%s:%s) "+
		"or remove it from the Stack",
		sa, strings.Join(parts, "; "),
		ns, role, first.Verb, first.ResourceName(), first.Name, ns, role, role, ns, sa)
}
