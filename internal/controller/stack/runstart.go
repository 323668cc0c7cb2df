package stack

import (
	"context"
	"fmt"

	"github.com/terrace-dev/terrace/internal/runphase"
)

// runnerStart is a run's runner pod being started (a warm pod claimed, or
// a pod created) and sent the run's module while the run is announced.
type runnerStart struct {
	done chan struct{}
	// cancel stops a start that is no longer wanted (abandon); a started
	// run lives on its context, so it is not called otherwise.
	cancel context.CancelFunc
	sess   runSession
	err    error
	// sourceErr is the module's load into the started runner, done as
	// soon as the runner took the run's credentials.
	sourceErr error
}

// startRunner starts the run's runner while its announcement (a status
// patch) is written: both are API round trips on every run's path, and
// neither needs the other. Once the runner holds the run's credentials it
// is sent the module, which needs neither the announcement nor the pod's
// relabel (a claimed warm pod's). Nothing that reaches the state server
// starts before awaitRunner returned and the pod is labelled (awaitLabels):
// the state server takes the run's certificate only once the status names
// the run and its pod carries the run's labels. A run that must recover
// from dead runs first starts its runner in awaitRunner, after that.
func (r *Reconciler) startRunner(ctx context.Context, s *scope) *runnerStart {
	req := runRequestFor(s)
	req.Stack = s.stack.DeepCopy() // the announcement's patch rewrites s.stack meanwhile
	src := s.source
	ctx, cancel := context.WithCancel(ctx)
	st := &runnerStart{done: make(chan struct{}), cancel: cancel}
	timings := &s.run.timings // this goroutine's alone until awaitRunner
	go func() {
		defer func() {
			// Off the reconcile's goroutine, a panic would end the process.
			if p := recover(); p != nil {
				st.err = fmt.Errorf("starting the runner panicked: %v", p)
			}
			close(st.done)
		}()
		podDone := timings.Start(runphase.Pod)
		st.sess, st.err = r.Runs.Start(ctx, req)
		podDone()
		if st.err == nil {
			st.sourceErr = r.loadInto(st.sess, src, timings)
		}
	}()
	return st
}

// awaitRunner takes the run's started runner, with the module loaded:
// the one startRunner started beside the announcement, or, after
// recovering from dead runs, one started and loaded now. A first run of a
// Stack that never had a run announced then removes any pod a run left
// whose announcement never landed (from the cache: no API call unless
// there is one); its own pod, being in use, is kept. A failed load is the
// source's error, as the Stack's status words it; the runner is the run's
// all the same, for closeRun.
func (r *Reconciler) awaitRunner(ctx context.Context, s *scope) error {
	run := s.run
	sess, err := r.takeRunner(ctx, s, run.starting)
	if sess == nil {
		return err
	}
	run.session, run.client, run.logf = sess, sess.Client(), runLogger(ctx, sess.ID())
	if s.source.origin == fromGit {
		// Looked at, whatever came of it: a ref that failed waits for
		// the next interval (or the failure's retry), not the next event.
		now := r.now()
		s.observed.gitCheckedAt = &now
	}
	if err != nil {
		return err
	}
	run.facts.runnerReady = true
	run.facts.sourceCloned = s.source.git != nil && s.source.git.cloned != nil
	return nil
}

func (r *Reconciler) takeRunner(ctx context.Context, s *scope, st *runnerStart) (runSession, error) {
	if st == nil {
		podDone := s.run.timings.Start(runphase.Pod)
		sess, err := r.Runs.Start(ctx, runRequestFor(s))
		podDone()
		if err != nil {
			return nil, startError(err)
		}
		s.observed.attempted = attemptedRevision(s.source)
		return sess, sourceError(s, r.loadInto(sess, s.source, &s.run.timings))
	}
	<-st.done
	if st.err != nil {
		return nil, startError(st.err)
	}
	if s.run.sweep {
		if err := r.cleanupEarlierRuns(ctx, s); err != nil {
			// Such a pod can do nothing (the state server refuses its
			// run) and its deadline ends it; the run goes on, and the
			// next run sweeps again.
			s.log.Error(err, "failed to remove runner pods of runs that were never announced")
		} else {
			r.cleanedUpHere(s)
		}
	}
	s.observed.attempted = attemptedRevision(s.source)
	return st.sess, sourceError(s, st.sourceErr)
}

// labelWaiter is a runSession whose pod may still be getting the run's
// labels (*launcher.Run.Labelled: a claimed warm pod's relabel).
type labelWaiter interface {
	Labelled(ctx context.Context) error
}

// awaitLabels waits until the run's pod is labelled for the run, as the
// state server requires before it takes the run's certificate. The wait
// left after the module's load counts as the run's pod phase.
func awaitLabels(ctx context.Context, s *scope, sess runSession) error {
	l, ok := sess.(labelWaiter)
	if !ok {
		return nil
	}
	defer s.run.timings.Start(runphase.Pod)()
	return startError(l.Labelled(ctx))
}

// loadInto loads the module into the started runner, timed as the run's
// fetch phase.
func (r *Reconciler) loadInto(sess runSession, src *source, timings *runphase.Timings) error {
	defer timings.Start(runphase.Fetch)()
	return r.loadSource(sess.Context(), src, sess.Client())
}

// abandon stops the start of a run whose announcement failed and gives
// the run the runner if it had started, so that closeRun removes its pod.
func (st *runnerStart) abandon(s *scope) {
	if st == nil {
		return
	}
	st.cancel()
	<-st.done
	if st.sess != nil {
		s.run.session = st.sess
	}
}

// sourceError is a failed load of the module, classified for the status.
func sourceError(s *scope, err error) error {
	if err != nil {
		return classifySourceError(s, err)
	}
	return nil
}

func startError(err error) error {
	if err != nil {
		return fmt.Errorf("failed to start a runner: %w", err)
	}
	return nil
}

// attemptedRevision is the revision a runner is loaded with: for a Git
// source none yet, until the clone says which commit (adoptClonedSource).
func attemptedRevision(src *source) string {
	if src.origin == fromGit {
		return ""
	}
	return src.revision
}
