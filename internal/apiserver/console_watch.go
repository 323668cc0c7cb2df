package apiserver

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// WatchAll sends the Stacks ListAll shows, then their changes, by
// watching Stacks as the caller over the same scope. When the Kubernetes
// API ends the watch or its version expires, the stream ends and the
// caller lists again: a fresh stream starts from the whole list.
func (s *service) WatchAll(ctx context.Context, req *connect.Request[apiv1.ListAllRequest], stream *connect.ServerStream[apiv1.WatchResponse]) error {
	ctx, c, err := s.begin(ctx, req.Header(), target{cluster: req.Msg.GetCluster()}, false)
	if err != nil {
		return err
	}
	scope, err := c.site.listScope(ctx, req.Msg)
	if err != nil {
		return err
	}
	sent := map[string]*apiv1.Installation{}
	for i := range scope.stacks.Items {
		if err := s.sendListed(c.site, stream, scope, sent, listed{stack: &scope.stacks.Items[i]}); err != nil {
			return err
		}
	}
	events, stop, err := c.site.watchScope(ctx, scope)
	if err != nil {
		return err
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			switch ev.Type {
			case watch.Error:
				if status, isStatus := ev.Object.(*metav1.Status); isStatus && status.Code == 410 {
					return nil
				}
				return kubeError(apierrors.FromObject(ev.Object), "the watch of Stacks")
			case watch.Added, watch.Modified, watch.Deleted:
				stack, ok := ev.Object.(*terracev1.Stack)
				if !ok {
					return fmt.Errorf("the watch of Stacks sent a %T", ev.Object)
				}
				if err := s.sendListed(c.site, stream, scope, sent, listed{stack: stack, gone: ev.Type == watch.Deleted}); err != nil {
					return err
				}
			}
		}
	}
}

// listed is a Stack as the list or a watch event has it; gone once deleted.
type listed struct {
	stack *terracev1.Stack
	gone  bool
}

// sendListed sends a Stack when it changed, or its removal when it no
// longer matches (or is gone) after having been sent.
func (s *service) sendListed(st *site, stream *connect.ServerStream[apiv1.WatchResponse], scope *listScope, sent map[string]*apiv1.Installation, l listed) error {
	key := l.stack.Namespace + "/" + l.stack.Name
	in := s.shown(st, l.stack)
	if l.gone || !scope.matches(in) {
		last, was := sent[key]
		if !was {
			return nil
		}
		delete(sent, key)
		return stream.Send(&apiv1.WatchResponse{Installation: last, Deleted: true})
	}
	if proto.Equal(in, sent[key]) {
		return nil
	}
	sent[key] = in
	return stream.Send(&apiv1.WatchResponse{Installation: in})
}

// watchScope watches the Stacks of scope as the caller: with one watch
// when the list was cluster-wide, else one per namespace listed, their
// events merged. The channel closes when any watch ends (the caller then
// lists again); stop ends them all.
func (s *site) watchScope(ctx context.Context, scope *listScope) (<-chan watch.Event, func(), error) {
	if scope.listed == nil {
		opts := append(scope.options, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: scope.stacks.ResourceVersion}})
		w, err := s.Caller.Watch(ctx, &terracev1.StackList{}, opts...)
		if err != nil {
			return nil, nil, kubeError(err, "Stacks")
		}
		return w.ResultChan(), w.Stop, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	var watches []watch.Interface
	stop := func() {
		cancel()
		for _, w := range watches {
			w.Stop()
		}
	}
	for _, ns := range scope.listed {
		opts := append(slices.Clone(scope.options), client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: scope.versions[ns]}})
		w, err := s.Caller.Watch(ctx, &terracev1.StackList{}, opts...)
		if err != nil {
			stop()
			return nil, nil, kubeError(err, "Stacks in namespace "+ns)
		}
		watches = append(watches, w)
	}
	merged := make(chan watch.Event)
	done := make(chan struct{})
	var once sync.Once
	for _, w := range watches {
		go func() {
			defer once.Do(func() { close(done) })
			for ev := range w.ResultChan() {
				select {
				case merged <- ev:
				case <-done:
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	// merged closes once a watch ends, so the stream ends and the caller lists again.
	out := make(chan watch.Event)
	go func() {
		defer close(out)
		for {
			select {
			case ev := <-merged:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, stop, nil
}
