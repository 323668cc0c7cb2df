package stackview

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// Flux's kustomize-controller (wait: true, healthChecks) and `kubectl wait`
// judge a Stack with kstatus. These are the Stacks the controller writes;
// docs/monitoring.md says what each means for a Flux Kustomization.
func TestKstatusReadsStacksAsFluxDoes(t *testing.T) {
	cases := []struct {
		name, doc string
		want      status.Status
	}{
		{"applied", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Applied, message: applied}`, status.CurrentStatus},
		{"a run in progress", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 1
  conditions:
  - {type: Ready, status: "Unknown", reason: Progressing, message: planning}
  - {type: Reconciling, status: "True", reason: Progressing, message: planning}`, status.InProgressStatus},
		{"a new generation not yet seen", `
metadata: {name: web, generation: 3}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Applied, message: applied}`, status.InProgressStatus},
		{"awaiting approval: Flux waits, then times out", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "False", reason: AwaitingApproval, message: "plan plan-2-abc awaits approval"}`, status.InProgressStatus},
		{"failed for good", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "False", reason: UndeclaredVariable, message: "quote the key"}
  - {type: Stalled, status: "True", reason: UndeclaredVariable, message: "quote the key"}`, status.FailedStatus},
		{"being deleted", `
metadata: {name: web, generation: 2, deletionTimestamp: "2026-03-01T10:00:00Z"}
status: {observedGeneration: 2}`, status.TerminatingStatus},
		// kstatus cannot tell a Stack no controller has touched from a
		// settled one: docs/monitoring.md gives Flux a healthCheckExprs rule.
		{"no status yet", `
metadata: {name: web, generation: 1}`, status.CurrentStatus},
	}
	for _, c := range cases {
		js, err := yaml.YAMLToJSON([]byte("apiVersion: terrace.dev/v1alpha1\nkind: Stack\n" + c.doc))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil { // integers as int64, as the API server sends them
			t.Fatal(err)
		}
		res, err := status.Compute(u)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if res.Status != c.want {
			t.Errorf("%s: kstatus %s (%s), want %s", c.name, res.Status, res.Message, c.want)
		}
	}
}
