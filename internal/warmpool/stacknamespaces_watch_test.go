package warmpool_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/internal/warmpool"
)

// Against a real API server: before the Stack informer's first list the
// namespaces are refused, not reported empty (an empty answer would remove
// every warm pod at a controller start); after it they include Stacks made
// before the cache started, and a namespace's last deleted Stack drops it.
func TestWatchStackNamespacesWaitsForTheFirstList(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	withStacks := env.Namespace(t)
	_ = env.Namespace(t) // a namespace without Stacks, never reported
	stack := validStack(withStacks, "web")
	if err := env.Client.Create(ctx, stack); err != nil {
		t.Fatal(err)
	}

	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	n, err := warmpool.WatchStackNamespaces(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	early, stop := context.WithCancel(ctx)
	stop()
	if got, err := n.Namespaces(early); err == nil || !strings.Contains(err.Error(), "not synced") {
		t.Fatalf("before the cache started: %v, %v; want a not-synced error", got, err)
	}

	go func() { _ = c.Start(ctx) }()
	got, err := n.Namespaces(ctx)
	if err != nil || !slices.Equal(got, []string{withStacks}) {
		t.Fatalf("after the first list: %v (%v), want [%s]", got, err, withStacks)
	}
	if err := env.Client.Delete(ctx, stack); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := n.Namespaces(ctx)
		return err == nil && len(got) == 0, err
	})
	if err != nil {
		t.Fatalf("the deleted Stack's namespace stayed: %v", err)
	}
}

func validStack(ns, name string) *terracev1.Stack {
	s := stackIn(ns, name)
	s.Spec.Source = terracev1.StackSource{URL: "https://example.com/m.tar.gz", Digest: "sha256:" + strings.Repeat("0", 64)}
	return s
}
