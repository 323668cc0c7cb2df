package stack

import (
	"context"
	"errors"
	"fmt"

	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// RunnerPolicyViolationReason: the Stack's runner pod (its spec.runner, or
// the image or ServiceAccount it resolves to) is refused by the runner
// policy of its TerraceConfigs; nothing runs until one of them changes.
const RunnerPolicyViolationReason = "RunnerPolicyViolation"

// checkRunnerPolicy refuses, as a terminal error, a Stack whose runner pod
// the effective runner policy does not allow.
func checkRunnerPolicy(s *scope) error {
	if err := s.config.CheckRunner(s.stack); err != nil {
		return reconcile.Terminal(RunnerPolicyViolationReason, err)
	}
	return nil
}

// LauncherRuns starts runs in runner pods through internal/launcher.
type LauncherRuns struct {
	Launcher *launcher.Launcher
	// ProviderMirror is passed to every runner (a directory in the pod).
	ProviderMirror string
}

// Start creates the run's pod and connects to it.
func (l LauncherRuns) Start(ctx context.Context, req runRequest) (runSession, error) {
	runID := req.RunID
	if runID == "" {
		runID = launcher.NewRunID() // not announced: the state server will refuse it
	}
	spec := launcher.RunSpec{
		Stack:              req.Stack,
		RunID:              runID,
		Image:              req.Config.RunnerImage,
		Binary:             req.Config.Binary,
		ServiceAccountName: req.Config.ServiceAccountName,
		Resources:          req.Config.Resources,
		Env:                req.Config.Env,
		ProviderMirror:     l.ProviderMirror,
		Retain:             req.Config.Retain,
		// The launcher checks the policy again right before it creates
		// anything: no path to a runner pod skips it.
		Policy:              &req.Config.RunnerPolicy,
		ImageField:          req.Config.RunnerImageField,
		ServiceAccountField: req.Config.ServiceAccountField,
	}
	run, err := l.Launcher.Start(ctx, spec)
	if err != nil {
		if errors.Is(err, launcher.ErrPolicyViolation) {
			return nil, reconcile.Terminal(RunnerPolicyViolationReason, err)
		}
		if errors.Is(err, launcher.ErrInvalidSpec) {
			return nil, reconcile.Terminal(RunnerFailedReason, err)
		}
		return nil, err
	}
	runnerStartDuration.Observe(run.StartDuration().Seconds())
	return launchedRun{run}, nil
}

// Cleanup removes runner pods of earlier runs of a Stack.
func (l LauncherRuns) Cleanup(ctx context.Context, namespace, stack string) error {
	return l.Launcher.Cleanup(ctx, namespace, stack)
}

type launchedRun struct{ *launcher.Run }

// Died returns why the runner pod died, or nil while it lives or after a
// normal close.
func (r launchedRun) Died() error {
	var term *launcher.TerminatedError
	if err := r.Err(); errors.As(err, &term) {
		return fmt.Errorf("%w", term)
	}
	return nil
}
