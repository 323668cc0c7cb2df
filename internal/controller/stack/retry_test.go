package stack

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/settings"
)

// The delay of a retry comes from the failure count stored in the status,
// not from a counter in the controller's memory: a new controller process
// (a restart) that sees a Stack with two failures recorded retries its
// third after retryInterval·2², and its Warning event says so.
func TestTheRetryDelayAfterARestartIsTheOneTheEventNames(t *testing.T) {
	ctx := context.Background()
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", Generation: 1},
		Spec: terracev1.StackSpec{RetryInterval: &metav1.Duration{Duration: 10 * time.Second}}}
	stack.Status.Failures = 2 // counted by the process before the restart
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(stack).WithStatusSubresource(stack).Build()
	live := &terracev1.Stack{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(stack), live); err != nil {
		t.Fatal(err)
	}
	recorder := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Recorder: recorder} // a new process: nothing in memory
	s := &scope{stack: live, log: logr.Discard(), patcher: outcome.NewStatusPatcher(c, live),
		config: settings.Effective{Interval: time.Hour}}

	result, err := r.finish(ctx, s, errors.New("failed to read the Stack before a run: connection refused"), 0)
	if err != nil {
		t.Fatalf("finish returned %v: a retry's delay must be its RequeueAfter, not the rate limiter's", err)
	}
	const want = 40 * time.Second
	if result.RequeueAfter != want {
		t.Fatalf("retry after %s, want %s", result.RequeueAfter, want)
	}
	stored := &terracev1.Stack{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(stack), stored); err != nil {
		t.Fatal(err)
	}
	if stored.Status.Failures != 3 {
		t.Fatalf("status.failures %d, want 3", stored.Status.Failures)
	}
	select {
	case ev := <-recorder.Events:
		if !strings.Contains(ev, "retry in 40s") {
			t.Fatalf("event %q does not name the delay of %s", ev, want)
		}
	default:
		t.Fatal("no Warning event for the failure")
	}
}

// Drift checks and interval requeues are spread over a tenth of the
// interval, by an amount of each Stack's own: Stacks created together do
// not check together, and each keeps its rhythm.
func TestIntervalRequeuesAreJittered(t *testing.T) {
	const interval = 10 * time.Minute
	seen := map[time.Duration]bool{}
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)}}
		got := jitter(st, interval)
		if got < interval || got >= interval+interval/10 {
			t.Fatalf("%s: %s, want within [%s, %s)", name, got, interval, interval+interval/10)
		}
		if again := jitter(st, interval); again != got {
			t.Fatalf("%s: %s then %s: a Stack's jitter moves", name, got, again)
		}
		seen[got] = true
	}
	if len(seen) < 4 {
		t.Fatalf("six Stacks share %d delays: not spread", len(seen))
	}
}
