package stack

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// walkLog collects the controller's "next action" log lines (decideAndAct,
// at V(1)) by Stack.
type walkLog struct {
	mu    sync.Mutex
	steps map[string][]string
}

func (w *walkLog) record(obj string) {
	var line struct {
		Msg    string            `json:"msg"`
		Stack  map[string]string `json:"stack"`
		State  string            `json:"state"`
		Action string            `json:"action"`
	}
	if !strings.Contains(obj, `"next action"`) || json.Unmarshal([]byte(obj), &line) != nil || line.Msg != "next action" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.steps == nil {
		w.steps = map[string][]string{}
	}
	key := line.Stack["namespace"] + "/" + line.Stack["name"]
	w.steps[key] = append(w.steps[key], line.State+"→"+line.Action)
}

func (w *walkLog) of(namespace, name string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.steps[namespace+"/"+name])
}

// The walk of one auto-approved run of new inputs, from Reconcile to
// Ready: every decision is a state named by determineState and the one
// action actionFor gives it, in this order. `go test -run
// TestEnvtestTheWalkOfAnAutoApprovedRun -v` prints it. It has the suite's
// controller to itself: beside the parallel tests, every run slot may be
// taken, and a queued run's walk has detours (RunQueued, then the cache
// checked again) that are the queue's, not the run's.
func TestEnvtestTheWalkOfAnAutoApprovedRun(t *testing.T) {
	e := serialSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "hello"}, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
	})
	e.waitFor("web", "Ready", readyAt)
	walk := suite.walks.of(e.ns, "web")
	for i, step := range walk {
		t.Logf("%2d %s", i+1, step)
	}
	want := []string{
		"Unresolved→resolve",
		"OutOfSync→startPlanRun",
		"RunAnnouncing→announce",
		"RunnerStarting→awaitRunner",
		"RunnerReady→initialise",
		"PlanDue→plan",
		"Applied→settle",
		"RunDone→finishRun",
	}
	if len(walk) < len(want) || !slices.Equal(walk[:len(want)], want) {
		t.Fatalf("walk\n%s\nwant\n%s", strings.Join(walk, "\n"), strings.Join(want, "\n"))
	}
	// A later reconcile (woken by the run's end) starts no second run.
	for _, step := range walk[len(want):] {
		if strings.Contains(step, "→start") || strings.Contains(step, "announce") {
			t.Errorf("after the run: %s", step)
		}
	}
}
