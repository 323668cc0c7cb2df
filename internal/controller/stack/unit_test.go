package stack

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/settings"
)

func TestDriftIsJudgedByInputsNotByWhatStartedTheRun(t *testing.T) {
	applied := func(digest string) *terracev1.Stack {
		s := &terracev1.Stack{}
		s.Status.LastAppliedInputsDigest = digest
		return s
	}
	cases := []struct {
		name       string
		stack      *terracev1.Stack
		kind       runKind
		mode       terracev1.DriftDetectionMode
		hasChanges bool
		want       bool
	}{
		{"drift check with changes", applied("sha256:in"), runDrift, terracev1.DriftDetectionEnabled, true, true},
		{"drift check without changes", applied("sha256:in"), runDrift, terracev1.DriftDetectionEnabled, false, false},
		{"retry of a failed drift check", applied("sha256:in"), runPlan, terracev1.DriftDetectionEnabled, true, true},
		{"retry under warn", applied("sha256:in"), runPlan, terracev1.DriftDetectionWarn, true, true},
		{"new inputs", applied("sha256:old"), runPlan, terracev1.DriftDetectionEnabled, true, false},
		{"first plan", applied(""), runPlan, terracev1.DriftDetectionEnabled, true, false},
		{"detection disabled", applied("sha256:in"), runPlan, terracev1.DriftDetectionDisabled, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{}
			s := &scope{stack: tc.stack, inputs: &inputs{digest: "sha256:in"}, config: settings.Effective{DriftMode: tc.mode}}
			if got := r.isDrift(s, tc.kind, tc.hasChanges); got != tc.want {
				t.Fatalf("isDrift = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRetryBackoffDoublesUpToTheMaximum(t *testing.T) {
	s := &terracev1.Stack{Spec: terracev1.StackSpec{
		RetryInterval: &metav1.Duration{Duration: 30 * time.Second}, MaxRetryInterval: &metav1.Duration{Duration: 5 * time.Minute},
	}}
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	for i, w := range want {
		if got := retryBackoff(s, int64(i+1)); got != w {
			t.Errorf("failure %d: backoff %s, want %s", i+1, got, w)
		}
	}
	if got := retryBackoff(s, 500); got != 5*time.Minute {
		t.Errorf("huge failure count: %s", got)
	}
}

func TestGatherInputs(t *testing.T) {
	ns := "team"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ns, ResourceVersion: "7"},
		Data: map[string][]byte{"token": []byte("s3cret"), "count": []byte("3")}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: ns}, Data: map[string]string{"region": "eu", "count": "4"}}
	c := (&authorizer{allowAll: true}).client(secret, cm)
	r := &Reconciler{Client: c, APIReader: c}
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: ns}, Spec: terracev1.StackSpec{
		Vars: map[string]apiextensionsv1.JSON{"region": {Raw: []byte(`"us"`)}, "tags": {Raw: []byte(`{"a":1}`)}},
		VarsFrom: []terracev1.VarsReference{
			{Kind: "Secret", Name: "creds"},
			{Kind: "ConfigMap", Name: "settings", Keys: []string{"region"}},
			{Kind: "Secret", Name: "absent", Optional: true},
		},
	}}
	s := &scope{stack: stack, source: &source{digest: "sha256:src"}}
	if err := r.gatherInputs(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"region": `"eu"`, "tags": `{"a":1}`, "token": `"s3cret"`, "count": `3`}
	for k, v := range want {
		if string(s.inputs.vars[k]) != v {
			t.Errorf("var %s = %s, want %s", k, s.inputs.vars[k], v)
		}
	}
	if got, _ := json.Marshal(s.inputs.sensitive); string(got) != `["count","token"]` {
		t.Errorf("sensitive = %s", got)
	}
	first := s.inputs.digest

	// The digest follows the Secret's version, never its value.
	secret.Data["token"] = []byte("rotated")
	if err := c.Update(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	if err := r.gatherInputs(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if s.inputs.digest == first {
		t.Error("changing a Secret did not change the inputs digest")
	}

	// Missing, not optional: terminal, naming the object.
	stack.Spec.VarsFrom = append(stack.Spec.VarsFrom, terracev1.VarsReference{Kind: "Secret", Name: "gone"})
	err := r.gatherInputs(context.Background(), s)
	var terminal *outcome.TerminalError
	if !errors.As(err, &terminal) || terminal.Reason != VarsNotFoundReason {
		t.Fatalf("missing Secret: %v", err)
	}
	// A missing key.
	stack.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "ConfigMap", Name: "settings", Keys: []string{"nope"}}}
	if err := r.gatherInputs(context.Background(), s); !errors.As(err, &terminal) {
		t.Fatalf("missing key: %v", err)
	}
}

// A Stack read from a cache that has not seen the last status write must
// not start a run: the run was decided from the old status and would be
// repeated (a second apply, or drift applied that warn mode only reports).
func TestNoRunFromAStaleCache(t *testing.T) {
	ctx := context.Background()
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "team"}}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(stack).WithStatusSubresource(stack).Build()
	var cached terracev1.Stack
	if err := c.Get(ctx, client.ObjectKeyFromObject(stack), &cached); err != nil {
		t.Fatal(err)
	}
	// The previous reconcile applied and wrote its status; the cache has
	// not seen it yet.
	written := cached.DeepCopy()
	written.Status.LastAppliedInputsDigest = "sha256:in"
	if err := c.Status().Update(ctx, written); err != nil {
		t.Fatal(err)
	}

	r := &Reconciler{Client: c, APIReader: c, Runs: nil} // starting a run would panic
	s := &scope{stack: &cached, inputs: &inputs{digest: "sha256:in"}, options: &runOptions{}, source: &source{}, log: logr.Discard(),
		config: settings.Effective{Interval: time.Minute, DriftMode: terracev1.DriftDetectionEnabled}}
	if err := r.decideAndAct(ctx, s); err != nil {
		t.Fatal(err)
	}
	if !s.observed.staleCache {
		t.Fatal("a run was decided from a stale cache")
	}
	if want := []string{"CacheUnverified→verifyCache", "CacheStale→waitForCache"}; !slices.Equal(s.walk, want) {
		t.Fatalf("walk %v, want %v", s.walk, want)
	}
}
