package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// stackWatch prints a get row for every change of the listed Stacks after
// the list, as `kubectl get -w` does.
type stackWatch struct {
	namespace, name string
	allNamespaces   bool
	// resourceVersion is the list's: the watch starts right after it, so
	// no change is missed and none is printed twice.
	resourceVersion string
	wide            bool
}

func (w stackWatch) run(ctx context.Context, k *kube, out io.Writer) error {
	wc, err := client.NewWithWatch(k.config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return fmt.Errorf("failed to create a watching client: %w", err)
	}
	raw := &metav1.ListOptions{ResourceVersion: w.resourceVersion}
	if w.name != "" {
		raw.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.name).String()
	}
	opts := []client.ListOption{&client.ListOptions{Raw: raw}}
	if !w.allNamespaces {
		opts = append(opts, client.InNamespace(w.namespace))
	}
	watcher, err := wc.Watch(ctx, &terracev1.StackList{}, opts...)
	if err != nil {
		return describeAPIError(err, "Stacks", w.namespace)
	}
	defer watcher.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.ResultChan():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("the watch of Stacks ended (the API server closed it): run the command again")
			}
			if err := w.print(out, ev); err != nil {
				return err
			}
		}
	}
}

func (w stackWatch) print(out io.Writer, ev watch.Event) error {
	if ev.Type == watch.Error {
		return fmt.Errorf("the watch of Stacks failed: %v", ev.Object)
	}
	st, ok := ev.Object.(*terracev1.Stack)
	if !ok {
		return nil
	}
	row := stackRow(st, w.allNamespaces, w.wide, time.Now())
	if ev.Type == watch.Deleted {
		row[len(row)-1] += " (deleted)"
	}
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, tableRow(row))
	return tw.Flush()
}
