package stack

import (
	"context"
	"encoding/json"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// Regression tests for what the chaos harness found in release records
// (docs/reliability.md, "Found" 1, 2 and 6).

// suiteStores are the Secrets stores the suite's controller writes.
func suiteStores() (*secrets.Store, release.History) {
	store := secrets.New(suite.env.Client, secrets.Options{})
	return store, release.History{Store: store}
}

func (e *suiteEnv) releases(name string) []release.Release {
	e.t.Helper()
	_, h := suiteStores()
	all, err := h.List(context.Background(), e.ns, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return all
}

func (e *suiteEnv) currentState(name string) *state.State {
	e.t.Helper()
	store, _ := suiteStores()
	st, err := store.Get(context.Background(), state.Key{Namespace: e.ns, Stack: name, Workspace: state.DefaultWorkspace})
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// Found 1: the status patch naming release 2 was lost (kube-apiserver
// restarting), so status.release still named release 1. The next reconcile
// that plans no changes names release 2 again.
func TestEnvtestStaleReleaseStatusIsRepaired(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "one"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	first := e.waitFor("web", "Ready", readyAt)
	e.update("web", func(st *terracev1.Stack) { st.Spec.Vars["greeting"] = jsonString("two") })
	second := e.waitFor("web", "Ready at release 2", func(st *terracev1.Stack) bool {
		return readyAt(st) && st.Status.Release != nil && st.Status.Release.Revision == 2
	})
	if serial := e.currentState("web").Serial; second.Status.Release.StateSerial != serial || first.Status.Release.StateSerial >= serial {
		t.Fatalf("status.release serials %d then %d, the state's serial is %d", first.Status.Release.StateSerial, second.Status.Release.StateSerial, serial)
	}

	// What the status held before the lost patch.
	stale := second.DeepCopy()
	stale.Status.Release = first.Status.Release
	if err := e.c.Status().Update(context.Background(), stale); err != nil {
		t.Fatal(err) // a settled Stack: nothing else writes it now
	}
	st := e.requestAndWait("web")
	if st.Status.Release == nil || st.Status.Release.Revision != 2 {
		t.Fatalf("status.release %+v after a plan without changes, want release 2", st.Status.Release)
	}
	if all := e.releases("web"); len(all) != 2 || all[1].Status != release.StatusDeployed || st.Status.Release.Status != string(release.StatusDeployed) {
		t.Fatalf("records %+v, status %+v: want release 2 deployed, no record added", all, st.Status.Release)
	}
}

// Found 2: a runner whose controller died finished its apply and saved the
// state; the next leader planned no changes and recorded nothing, so the
// history named a state the Stack was no longer at. A state no release
// names gets a release of its own, with its serial.
func TestEnvtestStateNoReleaseNamesIsRecorded(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "one"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	e.waitFor("web", "Ready", readyAt)

	// The apply nobody recorded: the same resources, the next serial.
	store, _ := suiteStores()
	current := e.currentState("web")
	var doc map[string]any
	if err := json.Unmarshal(current.Data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["serial"] = current.Serial + 1
	data, _ := json.Marshal(doc)
	if _, err := store.Put(context.Background(), current.Key, data, state.PutOptions{IfMatch: current.Version}); err != nil {
		t.Fatal(err)
	}

	st := e.requestAndWait("web")
	all := e.releases("web")
	if len(all) != 2 || all[0].Status != release.StatusSuperseded || all[1].Status != release.StatusDeployed ||
		all[1].StateSerial != current.Serial+1 || all[1].Message != recordedFromState || len(all[1].Outputs) != 1 {
		t.Fatalf("records %+v: want release 2 deployed for serial %d, recorded from the state with its outputs", all, current.Serial+1)
	}
	if st.Status.Release.StateSerial != current.Serial+1 {
		t.Errorf("status.release %+v, want state serial %d", st.Status.Release, current.Serial+1)
	}
	e.expectEvents("web", "Applied", "ReleaseRecorded")

	// In line again: the next plan without changes records nothing.
	e.requestAndWait("web")
	if n := len(e.releases("web")); n != 2 {
		t.Errorf("%d records after a plan without changes, want 2", n)
	}
}

// requestAndWait asks for a reconcile and waits until it was handled and
// the Stack is Ready.
func (e *suiteEnv) requestAndWait(name string) *terracev1.Stack {
	e.t.Helper()
	e.request(name)
	return e.waitFor(name, "Ready after the requested reconcile", func(st *terracev1.Stack) bool {
		asked := st.Annotations[terracev1.ReconcileRequestAnnotation]
		return readyAt(st) && asked != "" && st.Status.LastHandledReconcileAt == asked
	})
}

func jsonString(s string) apiextensionsv1.JSON {
	raw, _ := json.Marshal(s)
	return apiextensionsv1.JSON{Raw: raw}
}
