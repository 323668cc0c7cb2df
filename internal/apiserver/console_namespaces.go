package apiserver

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// listEachNamespace is ListAll for a caller who may not list Stacks in
// every namespace: it lists them namespace by namespace, in every
// Namespace when the caller may list those, else in the ones the request
// names and the server's own. A namespace where the caller may not list
// Stacks is skipped: RBAC, not an error, decides what they see.
func (s *site) listEachNamespace(ctx context.Context, scope *listScope, named []string) error {
	candidates, everyNamespace, err := s.candidateNamespaces(ctx, named)
	if err != nil {
		return err
	}
	scope.versions = map[string]string{}
	for _, ns := range candidates {
		var there terracev1.StackList
		err := s.Caller.List(ctx, &there, append(slices.Clone(scope.options), client.InNamespace(ns))...)
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return kubeError(err, "Stacks in namespace "+ns)
		}
		scope.add(ns, &there)
	}
	if len(scope.listed) == 0 {
		// Nowhere to look: the caller's own refusal says why. A list that
		// succeeds now means the caller's rights grew meanwhile (a
		// RoleBinding just made): it is the answer.
		var here terracev1.StackList
		if err := s.Caller.List(ctx, &here, append(slices.Clone(scope.options), client.InNamespace(s.Namespace))...); err != nil {
			return kubeError(err, "Stacks")
		}
		scope.add(s.Namespace, &here)
	}
	from := "the namespaces you named and " + s.Namespace
	if everyNamespace {
		from = "each namespace"
	}
	scope.note = fmt.Sprintf("You may not list Stacks in every namespace: showing those you may list, from %s: %s.", from, strings.Join(scope.listed, ", "))
	return nil
}

// add records one namespace's list.
func (l *listScope) add(ns string, list *terracev1.StackList) {
	l.listed = append(l.listed, ns)
	l.versions[ns] = list.ResourceVersion
	l.stacks.Items = append(l.stacks.Items, list.Items...)
}

// candidateNamespaces are every Namespace when the caller may list them,
// else named and the server's own namespace, sorted and without repeats.
func (s *site) candidateNamespaces(ctx context.Context, named []string) ([]string, bool, error) {
	var namespaces corev1.NamespaceList
	err := s.Caller.List(ctx, &namespaces)
	if err == nil {
		out := make([]string, 0, len(namespaces.Items))
		for _, ns := range namespaces.Items {
			out = append(out, ns.Name)
		}
		slices.Sort(out)
		return out, true, nil
	}
	if !apierrors.IsForbidden(err) {
		return nil, false, kubeError(err, "Namespaces")
	}
	out := []string{s.Namespace}
	for _, ns := range named {
		if ns = strings.TrimSpace(ns); ns != "" {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), false, nil
}
