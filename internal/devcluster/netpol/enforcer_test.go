package netpol

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// recordedApply is the apply function of a test: it fails while failures
// remain and hands every ruleset it is called with to the test.
type recordedApply struct {
	failures int
	calls    chan string
}

func (r *recordedApply) apply(_ context.Context, ruleset string) error {
	r.calls <- ruleset
	if r.failures > 0 {
		r.failures--
		return errors.New("nft: no such table")
	}
	return nil
}

func (r *recordedApply) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-r.calls:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the enforcer applied no ruleset within 10s")
		return ""
	}
}

func TestEnforcerAppliesTheClusterState(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	server := testPod("app", "server", "10.0.0.10", map[string]string{"app": "server"})
	client := fake.NewClientset(&server)
	rec := &recordedApply{failures: 1, calls: make(chan string, 100)}
	e := &Enforcer{Debounce: 200 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- e.run(ctx, client, rec.apply) }()

	// The first ruleset comes once the caches have synced; a failed apply
	// is retried with the same text.
	first := rec.next(t)
	if retried := rec.next(t); retried != first {
		t.Fatalf("the retry applied a different ruleset:\n%s\n---\n%s", first, retried)
	}
	if strings.Contains(first, "vmap") {
		t.Fatalf("no policy exists, yet a pod is isolated:\n%s", first)
	}

	deny := testPolicy("app", "deny", networkingv1.NetworkPolicySpec{PodSelector: *sel()})
	if _, err := client.NetworkingV1().NetworkPolicies("app").Create(ctx, &deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := rec.next(t); !strings.Contains(got, "ip daddr vmap { 10.0.0.10 : jump ingress-0 }") {
		t.Fatalf("after a default deny, the server is not isolated:\n%s", got)
	}

	// A change that does not alter the rules applies nothing: the next
	// apply is the burst's, and a burst is gathered into few applies.
	server.Annotations = map[string]string{"touched": "yes"}
	if _, err := client.CoreV1().Pods("app").Update(ctx, &server, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	const burst = 20
	for i := range burst {
		p := testPod("app", fmt.Sprintf("replica-%d", i), fmt.Sprintf("10.0.0.%d", 100+i), nil)
		if _, err := client.CoreV1().Pods("app").Create(ctx, &p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	applies := 0
	for {
		got := rec.next(t)
		applies++
		if !strings.Contains(got, "10.0.0.100") {
			t.Fatalf("the apply after an unchanged ruleset is not the burst's:\n%s", got)
		}
		if strings.Contains(got, fmt.Sprintf("10.0.0.%d : jump", 100+burst-1)) {
			break
		}
	}
	if applies >= burst {
		t.Errorf("%d pod creations took %d applies: changes are not gathered", burst, applies)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v when its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context ending")
	}
}
