package warmpool_test

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/warmpool"
)

func stackIn(ns, name string) *terracev1.Stack {
	return &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// A namespace holds Stacks from its first Stack's add to its last one's
// delete, however the informer delivers them: repeated adds and updates
// from a relist, and deletes it learnt of late.
func TestStackNamespacesFollowTheInformer(t *testing.T) {
	n := warmpool.NewStackNamespaces()
	n.OnAdd(stackIn("a", "one"), true)
	n.OnAdd(stackIn("a", "two"), true)
	n.OnAdd(stackIn("b", "one"), true)
	n.OnUpdate(stackIn("a", "one"), stackIn("a", "one")) // a relist's copy
	n.OnAdd(stackIn("a", "one"), false)
	check := func(want ...string) {
		t.Helper()
		got, err := n.Namespaces(context.Background())
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("namespaces %v (%v), want %v", got, err, want)
		}
	}
	check("a", "b")
	n.OnDelete(stackIn("a", "one"))
	check("a", "b")
	n.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "b/one", Obj: stackIn("b", "one")})
	check("a")
	n.OnAdd(stackIn("d", "one"), true)
	n.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "d/one"}) // no last known object
	check("a")
	n.OnDelete(stackIn("a", "two"))
	check()
	n.OnUpdate(nil, stackIn("c", "late")) // first seen in an update
	check("c")
}
