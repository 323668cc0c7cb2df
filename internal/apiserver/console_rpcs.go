package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// The calls the web console (internal/console) makes beyond the
// installation lifecycle. Each acts as the caller, like every other call:
// the console can do nothing its user could not do with kubectl.

func (s *service) ListAll(ctx context.Context, req *connect.Request[apiv1.ListAllRequest]) (*connect.Response[apiv1.ListAllResponse], error) {
	ctx, c, err := s.begin(ctx, req.Header(), target{cluster: req.Msg.GetCluster()}, false)
	if err != nil {
		return nil, err
	}
	out, err := c.site.listAll(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	for _, in := range out.Items {
		in.Cluster = c.site.Cluster
	}
	return connect.NewResponse(out), nil
}

func (s *service) Reconcile(ctx context.Context, req *connect.Request[apiv1.ReconcileRequest]) (*connect.Response[apiv1.Installation], error) {
	return s.changeStack(ctx, req.Header(), targetOf(req.Msg), func(stack *terracev1.Stack) {
		if stack.Annotations == nil {
			stack.Annotations = map[string]string{}
		}
		stack.Annotations[terracev1.ReconcileRequestAnnotation] = time.Now().UTC().Format(time.RFC3339Nano)
	})
}

func (s *service) Suspend(ctx context.Context, req *connect.Request[apiv1.SuspendRequest]) (*connect.Response[apiv1.Installation], error) {
	return s.changeStack(ctx, req.Header(), targetOf(req.Msg), func(stack *terracev1.Stack) { stack.Spec.Suspend = true })
}

func (s *service) Resume(ctx context.Context, req *connect.Request[apiv1.ResumeRequest]) (*connect.Response[apiv1.Installation], error) {
	return s.changeStack(ctx, req.Header(), targetOf(req.Msg), func(stack *terracev1.Stack) { stack.Spec.Suspend = false })
}

// changeStack patches a Stack as the caller (a merge patch
// of just what change touched, so a concurrent status write is not lost).
func (s *service) changeStack(ctx context.Context, header http.Header, to target, change func(*terracev1.Stack)) (*connect.Response[apiv1.Installation], error) {
	ctx, c, err := s.begin(ctx, header, to, true)
	if err != nil {
		return nil, err
	}
	stack, err := c.site.stack(ctx, c.name)
	if err != nil {
		return nil, err
	}
	before := stack.DeepCopy()
	change(stack)
	if err := c.site.Caller.Patch(ctx, stack, client.MergeFrom(before)); err != nil {
		return nil, kubeError(err, "Stack "+c.name)
	}
	in := installationOf(stack)
	in.Cluster = c.site.Cluster
	return connect.NewResponse(in), nil
}

func (s *service) GetAccess(ctx context.Context, req *connect.Request[apiv1.GetAccessRequest]) (*connect.Response[apiv1.Access], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	out := &apiv1.Access{}
	ns, group := c.site.Namespace, terracev1.GroupVersion.Group
	checks := map[*bool]authorizationv1.ResourceAttributes{
		&out.Update:      {Namespace: ns, Group: group, Resource: "stacks", Verb: "patch", Name: c.name},
		&out.Delete:      {Namespace: ns, Group: group, Resource: "stacks", Verb: "delete", Name: c.name},
		&out.ReadSecrets: {Namespace: ns, Resource: "secrets", Verb: "get"},
		&out.ReadLogs:    {Namespace: ns, Resource: "pods", Subresource: "log", Verb: "get"},
	}
	for into, attrs := range checks {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
		if err := c.site.Caller.Create(ctx, review); err != nil {
			return nil, kubeError(err, "an access review")
		}
		*into = review.Status.Allowed
	}
	return connect.NewResponse(out), nil
}

// listAll lists every Stack (installations are marked) cluster-wide when
// the caller may, else in the site's namespace, and filters them.
func (s *site) listAll(ctx context.Context, req *apiv1.ListAllRequest) (*apiv1.ListAllResponse, error) {
	scope, err := s.listScope(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListAllResponse{NamespacesNote: scope.note, ListedNamespaces: scope.listed}
	for i := range scope.stacks.Items {
		in := installationOf(&scope.stacks.Items[i])
		if !scope.matches(in) {
			continue
		}
		out.Items = append(out.Items, in)
		if !slices.Contains(out.Namespaces, in.Namespace) {
			out.Namespaces = append(out.Namespaces, in.Namespace)
		}
	}
	slices.Sort(out.Namespaces)
	return out, nil
}

// listScope is what a ListAll or WatchAll covers, and the Stacks there now.
type listScope struct {
	// options select the Stacks, for a list or a watch.
	options []client.ListOption
	phase   string
	note    string
	stacks  *terracev1.StackList
	// listed are the namespaces looked in one by one, when the caller may
	// not list Stacks in every namespace; versions their lists' versions.
	listed   []string
	versions map[string]string
}

func (l *listScope) matches(in *apiv1.Installation) bool { return l.phase == "" || in.Phase == l.phase }

func (s *site) listScope(ctx context.Context, req *apiv1.ListAllRequest) (*listScope, error) {
	selector := labels.Everything()
	if text := req.GetLabelSelector(); text != "" {
		parsed, err := labels.Parse(text)
		if err != nil {
			return nil, invalid(fmt.Sprintf("labelSelector %q is not a label selector: %v", text, err))
		}
		selector = parsed
	}
	scope := &listScope{phase: req.GetPhase(), stacks: &terracev1.StackList{}, options: []client.ListOption{client.MatchingLabelsSelector{Selector: selector}}}
	if ns := req.GetNamespace(); ns != "" {
		scope.options = append(scope.options, client.InNamespace(ns))
	}
	err := s.Caller.List(ctx, scope.stacks, scope.options...)
	if apierrors.IsForbidden(err) && req.GetNamespace() == "" {
		return scope, s.listEachNamespace(ctx, scope, req.GetNamespaces())
	}
	if err != nil {
		return nil, kubeError(err, "Stacks")
	}
	return scope, nil
}
