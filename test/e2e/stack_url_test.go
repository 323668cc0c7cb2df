package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// TestStackFromURL deploys a tarball served over HTTP, and refuses one
// whose digest does not match with a terminal condition.
func TestStackFromURL(t *testing.T) {
	e := newStackEnv(t)
	tarball, digest, err := artifact.Build(map[string][]byte{"envs/prod/main.tf": []byte(benchModule)})
	if err != nil {
		t.Fatal(err)
	}
	srv := newLinkServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(tarball)
	}))

	good := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "from-url"},
		Spec: terracev1.StackSpec{
			Source:      terracev1.StackSource{URL: srv.URL + "/module.tar.gz", Digest: digest},
			Path:        "envs/prod",
			Vars:        jsonVars(t, map[string]any{"n": 7}),
			ApprovePlan: terracev1.ApprovePlanAuto,
		},
	}
	e.create(t, good)
	st := e.waitStack(t, "from-url", stackTimeout, "Ready", readyAt)
	if st.Status.LastAppliedRevision != digest {
		t.Errorf("lastAppliedRevision = %q, want the digest %s", st.Status.LastAppliedRevision, digest)
	}

	bad := good.DeepCopy()
	bad.ObjectMeta = metav1.ObjectMeta{Name: "wrong-digest"}
	bad.Spec.Source.Digest = "sha256:" + strings.Repeat("0", 64)
	e.create(t, bad)
	e.waitStack(t, "wrong-digest", stackTimeout, "Stalled on the digest", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "SourceDigestMismatch")(s); err != nil {
			return err
		}
		if msg := outcome.Get(s, terracev1.ReadyCondition).Message; !strings.Contains(msg, "sha256:") {
			return fmt.Errorf("message does not show the digests: %s", msg)
		}
		return nil
	})
}
