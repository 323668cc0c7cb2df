package stack

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// A run is current from its announcement until every command of it
// returned: then the final status clears status.currentRun (the state
// server takes the run's certificate no more) and status.lastRun keeps its
// ID. A run cut short stays current: its runner, interrupted, may still
// save the state tofu was writing, and the next run recovers from it.
func TestARunIsCurrentUntilItFinishes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		finished    bool
		err         error
		wantCurrent string
	}{
		{name: "every command returned", finished: true, wantCurrent: ""},
		{name: "finished, then a later step failed", finished: true, err: errors.New("conflict writing the outputs Secret"), wantCurrent: ""},
		{name: "cut short", err: errors.New("runner pod stopped: OOMKilled"), wantCurrent: "run-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", Generation: 1}}
			r := &Reconciler{Now: time.Now}
			s := &scope{stack: stack, log: logr.Discard(), source: &source{revision: "rev-1"}, inputs: &inputs{digest: "sha256:in"},
				observed: observations{kind: runPlan, runStarted: &runAnnouncement{id: "run-1", message: "planning"}}}
			summarizeProgress(s, true, true)
			if stack.Status.CurrentRun != "run-1" || stack.Status.LastRun != "run-1" {
				t.Fatalf("announced: currentRun %q lastRun %q, want run-1 for both", stack.Status.CurrentRun, stack.Status.LastRun)
			}
			s.observed.runFinished = tc.finished
			r.summarize(context.Background(), s, tc.err)
			if stack.Status.CurrentRun != tc.wantCurrent || stack.Status.LastRun != "run-1" {
				t.Fatalf("after the run: currentRun %q lastRun %q, want %q and run-1", stack.Status.CurrentRun, stack.Status.LastRun, tc.wantCurrent)
			}
		})
	}
}
