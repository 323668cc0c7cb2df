package stack

import (
	"context"
	"errors"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/settings"
)

// storeSet is the stores of a Stack's namespace.
type storeSet = backend.Set

// storeProvider opens the stores of a namespace per its TerraceConfig.
type storeProvider interface {
	For(ctx context.Context, namespace string) (*backend.Set, error)
	// ForgetEmptyLocation drops the namespace's record of where its state
	// is once no state is left there.
	ForgetEmptyLocation(ctx context.Context, namespace string) error
}

// Reasons for the state backend.
const (
	// StateMigrationPendingReason: the namespace's state is moving to the
	// backend its TerraceConfig now names; runs wait until it is verified.
	StateMigrationPendingReason = "StateMigrationPending"
	// StateBackendMisconfiguredReason: the TerraceConfig's state settings
	// or their Secrets are wrong; only a person can fix them.
	StateBackendMisconfiguredReason = "StateBackendMisconfigured"
)

// migrationRecheck is how often a Stack waiting on a migration looks again.
const migrationRecheck = 5 * time.Second

// openStores opens the stores of the Stack's namespace for a run, which
// must not start while the namespace's state moves to another backend.
func (r *Reconciler) openStores(ctx context.Context, namespace string) (*storeSet, error) {
	set, err := r.Stores.For(ctx, namespace)
	switch {
	case errors.Is(err, backend.ErrMisconfigured):
		return nil, outcome.Terminal(StateBackendMisconfiguredReason, err)
	case err != nil:
		return nil, fmt.Errorf("failed to open the state backend: %w", err)
	}
	if loc := set.Location; loc.Pending() {
		return nil, outcome.Waiting(StateMigrationPendingReason, migrationRecheck, fmt.Errorf(
			"the state of namespace %s is moving from %s to %s (see the TerraceConfig's status.stateBackend): runs wait until the copy is verified",
			namespace, loc.Current, loc.Desired))
	}
	return set, nil
}

// runRequest describes the runner pod of one run.
type runRequest struct {
	Stack  *terracev1.Stack
	Config settings.Effective
	// RunID is the run announced in the Stack's status.currentRun.
	RunID string
}

func runRequestFor(s *scope) runRequest {
	return runRequest{Stack: s.stack, Config: s.config, RunID: s.run.id}
}

// runSession is a started runner pod and a connection to it.
type runSession interface {
	// ID is the run's identifier (in its pod name and certificate).
	ID() string
	// Client is connected over mutual TLS to the runner.
	Client() *runner.Client
	// Context is cancelled when the runner pod dies, so calls fail fast.
	Context() context.Context
	// Died reports why the runner pod died, or nil while it lives.
	Died() error
	// Close removes the pod unless the config retains it.
	Close(ctx context.Context) error
}

// idleMarker is a runSession that can be told that every command sent to
// its runner returned (*launcher.Run.MarkIdle): its pod is then removed at
// once, where a run cut short leaves the runner its grace period.
type idleMarker interface{ MarkIdle() }

// runStarter starts runner pods.
type runStarter interface {
	Start(ctx context.Context, req runRequest) (runSession, error)
	// Cleanup removes runner pods an earlier run of the Stack left behind.
	Cleanup(ctx context.Context, namespace, stack string) error
}

// runLogger passes runner log lines (already redacted by the runner) to the
// controller's log at debug level.
func runLogger(ctx context.Context, runID string) runner.LogFunc {
	logger := ctrl.LoggerFrom(ctx).WithValues("run", runID).V(1)
	return func(line string) { logger.Info(line) }
}
