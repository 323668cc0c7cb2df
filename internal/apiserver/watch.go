package apiserver

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// Watch sends the installation, then again each time what the API shows of
// it changes, until the caller goes away or the Stack is deleted. It
// watches the one Stack as the caller (list and watch on stacks), resuming
// from the last version seen when the Kubernetes API ends a watch.
func (s *service) Watch(ctx context.Context, req *connect.Request[apiv1.WatchRequest], stream *connect.ServerStream[apiv1.WatchResponse]) error {
	return s.watch(ctx, req, stream.Send)
}

// watchSend sends one event to the caller: on the Watch stream, or as a
// line of the REST route (watch_rest.go).
type watchSend func(*apiv1.WatchResponse) error

func (s *service) watch(ctx context.Context, req *connect.Request[apiv1.WatchRequest], send watchSend) error {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return err
	}
	st := c.site
	stack, err := st.stack(ctx, c.name)
	if err != nil {
		return err
	}
	last := s.shown(st, stack)
	if err := send(&apiv1.WatchResponse{Installation: last}); err != nil {
		return err
	}
	version := stack.ResourceVersion
	for {
		w, err := st.Caller.Watch(ctx, &terracev1.StackList{}, client.InNamespace(st.Namespace),
			client.MatchingFields{"metadata.name": c.name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: version, AllowWatchBookmarks: true}})
		if err != nil {
			return kubeError(err, "installation "+c.name)
		}
		var done bool
		version, done, err = s.relay(ctx, st, w, send, &last, version)
		w.Stop()
		if err != nil || done || ctx.Err() != nil {
			return err
		}
		if version == "" {
			// The version was too old to resume from: start again from the Stack as it is.
			if stack, err = st.stack(ctx, c.name); err != nil {
				return err
			}
			version = stack.ResourceVersion
			if err := s.sendIfChanged(st, send, &last, stack); err != nil {
				return err
			}
		}
	}
}

// relay passes one watch's events on until it ends, returning the version
// to resume from ("" when it expired), or done when the Stack is gone.
func (s *service) relay(ctx context.Context, st *site, w watch.Interface, send watchSend, last **apiv1.Installation, version string) (string, bool, error) {
	for {
		select {
		case <-ctx.Done():
			return version, true, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return version, false, nil
			}
			switch ev.Type {
			case watch.Error:
				if status, isStatus := ev.Object.(*metav1.Status); isStatus && status.Code == 410 {
					return "", false, nil
				}
				return version, true, kubeError(apierrors.FromObject(ev.Object), "the watch of installation "+(*last).Name)
			case watch.Bookmark:
				if stack, ok := ev.Object.(*terracev1.Stack); ok {
					version = stack.ResourceVersion
				}
			case watch.Deleted:
				gone := proto.Clone(*last).(*apiv1.Installation)
				gone.Deleting, gone.Phase = true, phaseDeleting
				return version, true, send(&apiv1.WatchResponse{Installation: gone, Deleted: true})
			case watch.Added, watch.Modified:
				stack, ok := ev.Object.(*terracev1.Stack)
				if !ok {
					return version, true, fmt.Errorf("the watch of installation %s sent a %T", (*last).Name, ev.Object)
				}
				version = stack.ResourceVersion
				// A watch begun on an installation ends when it stops being one.
				if (*last).Installation && stack.Labels[InstallationLabel] != "true" {
					return version, true, failure(connect.CodeNotFound, reasonNotAnInstallation, "Stack "+stack.Name+" is no longer an installation")
				}
				if err := s.sendIfChanged(st, send, last, stack); err != nil {
					return version, true, err
				}
			}
		}
	}
}

// sendIfChanged sends the installation when what the API shows of it differs
// from what was sent last.
func (s *service) sendIfChanged(st *site, send watchSend, last **apiv1.Installation, stack *terracev1.Stack) error {
	in := s.shown(st, stack)
	if proto.Equal(in, *last) {
		return nil
	}
	*last = in
	return send(&apiv1.WatchResponse{Installation: in})
}

// shown is the installation as a call of site sees it.
func (s *service) shown(st *site, stack *terracev1.Stack) *apiv1.Installation {
	in := installationOf(stack)
	in.Cluster = st.Cluster
	return in
}
