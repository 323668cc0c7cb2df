package stack

import (
	"context"
	"errors"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/warmpool"
)

// RunnerPolicyViolationReason: the Stack's runner pod (its spec.runner, or
// the image or ServiceAccount it resolves to) is refused by the runner
// policy of its TerraceConfigs; nothing runs until one of them changes.
const RunnerPolicyViolationReason = "RunnerPolicyViolation"

// checkRunnerPolicy refuses, as a terminal error, a Stack whose runner pod
// the effective runner policy does not allow.
func checkRunnerPolicy(s *scope) error {
	if err := s.config.CheckRunner(s.stack); err != nil {
		return outcome.Terminal(RunnerPolicyViolationReason, err)
	}
	return nil
}

// LauncherRuns starts runs in runner pods through internal/launcher,
// claiming a warm pod of the run's class when the pool has one.
type LauncherRuns struct {
	Launcher *launcher.Launcher
	// ProviderMirror is passed to every runner (a directory in the pod).
	ProviderMirror string
	// Warm holds the warm pods spec.runner.warm asks for; nil for none.
	Warm *warmpool.Pool
}

// runIDReserver is a runStarter that can give a run a warm pod: the run's
// ID is then the warm pod's, chosen before the run is announced.
type runIDReserver interface {
	ReserveRunID(req runRequest) string
}

// newRunID names the Stack's next run: after a warm pod of its class when
// one is ready, else a fresh ID (the run starts a pod of its own).
func (r *Reconciler) newRunID(s *scope) string {
	if res, ok := r.Runs.(runIDReserver); ok {
		if id := res.ReserveRunID(runRequest{Stack: s.stack, Config: s.config}); id != "" {
			return id
		}
	}
	return launcher.NewRunID()
}

func (l LauncherRuns) spec(req runRequest) launcher.RunSpec {
	spec := warmpool.SpecFor(req.Config, l.ProviderMirror)
	spec.Stack, spec.RunID = req.Stack, req.RunID
	return spec
}

// ReserveRunID implements runIDReserver.
func (l LauncherRuns) ReserveRunID(req runRequest) string {
	if l.Warm == nil || req.Config.Warm <= 0 {
		return ""
	}
	class, ok := launcher.Class(l.spec(req))
	if !ok {
		return ""
	}
	return l.Warm.Reserve(req.Stack.Namespace, class, client.ObjectKeyFromObject(req.Stack).String())
}

// Start claims the warm pod reserved for the run, or creates the run's pod,
// and connects to it.
func (l LauncherRuns) Start(ctx context.Context, req runRequest) (runSession, error) {
	if req.RunID == "" {
		req.RunID = launcher.NewRunID() // not announced: the state server will refuse it
	}
	spec := l.spec(req)
	run, err := l.claimWarm(ctx, spec)
	claimed := run != nil
	if run == nil && err == nil {
		// A start abandoned meanwhile (its announcement failed) creates
		// no pod of the run's own.
		if err = ctx.Err(); err == nil {
			run, err = l.Launcher.Start(ctx, spec)
		}
	}
	if err != nil {
		if errors.Is(err, launcher.ErrPolicyViolation) {
			return nil, outcome.Terminal(RunnerPolicyViolationReason, err)
		}
		if errors.Is(err, launcher.ErrInvalidSpec) {
			return nil, outcome.Terminal(RunnerFailedReason, err)
		}
		return nil, err
	}
	runnerStartDuration.Observe(run.StartDuration().Seconds())
	if claimed {
		return launchedRun{Run: run, ended: l.Warm.RunEnded}, nil
	}
	return launchedRun{Run: run}, nil
}

// claimWarm claims the warm pod reserved for the run; (nil, nil) when
// there is none or its claim failed for a reason a pod of the run's own
// may not have (the warm pod died): the run then starts one.
func (l LauncherRuns) claimWarm(ctx context.Context, spec launcher.RunSpec) (*launcher.Run, error) {
	if l.Warm == nil {
		return nil, nil
	}
	w, ok := l.Warm.Take(spec.Stack.Namespace, client.ObjectKeyFromObject(spec.Stack).String(), spec.RunID).(*launcher.Run)
	if !ok {
		return nil, nil
	}
	run, err := l.Launcher.Claim(ctx, w, spec)
	if err != nil {
		l.Warm.RunEnded() // the pod is gone: its replacement starts
	}
	if err == nil || errors.Is(err, launcher.ErrPolicyViolation) || errors.Is(err, launcher.ErrInvalidSpec) || ctx.Err() != nil {
		return run, err
	}
	ctrl.LoggerFrom(ctx).Info("failed to claim the warm runner, starting a runner of the run's own", "runID", spec.RunID, "error", err.Error())
	return nil, nil
}

// runCleaner is a runStarter that removes an earlier run's leftovers from
// its cache and by name, listing nothing.
type runCleaner interface {
	CleanupRun(ctx context.Context, namespace, stack, runID string) error
}

// cleanupEarlierRuns removes what earlier runs of the Stack left: on the
// hot path (a Stack's first run in this process, or after a run that did
// not settle) without a List of Secrets, which would grow with the namespace.
func (r *Reconciler) cleanupEarlierRuns(ctx context.Context, s *scope) error {
	if c, ok := r.Runs.(runCleaner); ok {
		return c.CleanupRun(ctx, s.stack.Namespace, s.stack.Name, s.run.previous)
	}
	return r.Runs.Cleanup(ctx, s.stack.Namespace, s.stack.Name)
}

// CleanupRun implements runCleaner.
func (l LauncherRuns) CleanupRun(ctx context.Context, namespace, stack, runID string) error {
	return l.Launcher.CleanupRun(ctx, namespace, stack, runID)
}

// Cleanup removes runner pods of earlier runs of a Stack.
func (l LauncherRuns) Cleanup(ctx context.Context, namespace, stack string) error {
	return l.Launcher.Cleanup(ctx, namespace, stack)
}

// launchedRun is a run in a runner pod; ended, when set, is called once
// it is closed (a warm pod's run: its replacement starts then).
type launchedRun struct {
	*launcher.Run
	ended func()
}

// A finished run's pod is deleted without a grace period (runInRunner).
var _ idleMarker = launchedRun{}

// Close deletes the run's pod, then reports the end.
func (r launchedRun) Close(ctx context.Context) error {
	err := r.Run.Close(ctx)
	if r.ended != nil {
		r.ended()
	}
	return err
}

// Died returns why the runner pod died, or nil while it lives or after a
// normal close.
func (r launchedRun) Died() error {
	var term *launcher.TerminatedError
	if err := r.Err(); errors.As(err, &term) {
		return fmt.Errorf("%w", term)
	}
	return nil
}
