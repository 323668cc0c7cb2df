package stack

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runphase"
)

// panickingRuns is a runStarter whose Start panics.
type panickingRuns struct{}

func (panickingRuns) Start(context.Context, runRequest) (runSession, error) { panic("boom") }
func (panickingRuns) Cleanup(context.Context, string, string) error         { return nil }

// A runner started beside the announcement runs off the reconcile's
// goroutine, where nothing would recover a panic: it becomes the run's
// error instead of ending the controller.
func TestAPanicStartingTheRunnerIsTheRunsError(t *testing.T) {
	r := &Reconciler{Runs: panickingRuns{}}
	s := &scope{stack: &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team"}}, run: &runScope{id: "r1"}}
	starting := r.startRunner(context.Background(), s)
	if starting == nil {
		t.Fatal("a run with nothing to recover did not start its runner beside the announcement")
	}
	s.run.starting = starting
	err := r.awaitRunner(context.Background(), s)
	if s.run.session != nil || s.run.facts.runnerReady || err == nil || !strings.Contains(err.Error(), "panicked: boom") {
		t.Fatalf("awaitRunner = %v (runner %v); want the panic as an error", err, s.run.session)
	}
}

// A start abandoned before the run's own pod is created (its announcement
// failed; a warm pod's claim failed on the cancelled context) creates no
// pod: the launcher, nil here, is not reached.
func TestAnAbandonedStartCreatesNoPod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team"}}
	sess, err := LauncherRuns{}.Start(ctx, runRequest{Stack: stack, RunID: "r1"})
	if sess != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v, %v; want the cancellation", sess, err)
	}
}

// labellingSession is a runSession whose pod's relabel ends with err.
type labellingSession struct {
	runSession
	err error
}

func (l labellingSession) Labelled(context.Context) error { return l.err }

// A claimed warm pod's relabel is waited for before tofu starts (the state
// server takes the run's certificate only from a labelled pod); a relabel
// that failed ends the run as a failed start, and the wait is the run's
// pod phase.
func TestInitWaitsForTheClaimedPodsLabels(t *testing.T) {
	s := &scope{run: &runScope{id: "r1"}}
	refused := errors.New("pods \"terrace-warm-r1\" is forbidden")
	err := awaitLabels(context.Background(), s, labellingSession{err: refused})
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "failed to start a runner") {
		t.Fatalf("awaitLabels after a failed relabel = %v; want a failed start wrapping it", err)
	}
	if _, ok := s.run.timings.Get(runphase.Pod); !ok {
		t.Error("the wait for the pod's labels was not timed as the pod phase")
	}
	if err := awaitLabels(context.Background(), s, labellingSession{}); err != nil {
		t.Fatalf("awaitLabels of a labelled pod = %v", err)
	}
	if err := awaitLabels(context.Background(), &scope{run: &runScope{id: "r2"}}, nil); err != nil {
		t.Fatalf("awaitLabels of a session that has no relabel = %v", err)
	}
}
