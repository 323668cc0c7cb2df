package stack

import (
	"context"
	"fmt"
	"time"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// Moving a Stack between controller shards (docs/sharding.md): the shard
// it leaves drops it from its cache, but a run it started goes on to its
// end there (the run holds its own copy of the Stack; its runner keeps
// talking to that shard's servers, which answer it while it is the
// Stack's status.currentRun) and its runner pod is deleted when it ends.
// The shard it joins must not announce a run meanwhile: the running tofu
// would lose its state server mid-apply. It waits for that pod to go, then
// recovers what the run left (its lock, if any) as after a restart.

// OtherShardRunReason: the Stack's current run was started by another
// controller shard (the Stack was moved between shards while it ran) and
// goes on there; this shard starts nothing until it ends.
const OtherShardRunReason = "RunOnOtherShard"

// otherShardRecheck is how often a Stack waiting for another shard's run
// looks again.
const otherShardRecheck = 5 * time.Second

// shardRuns is a runStarter that knows which runs other shards started.
type shardRuns interface {
	OtherShardRun(ctx context.Context, namespace, stack, runID string) (string, error)
}

// waitForOtherShardRun waits while the Stack's current run is another
// shard's and its runner pod may still run it.
func (r *Reconciler) waitForOtherShardRun(ctx context.Context, s *scope) error {
	runs, ok := r.Runs.(shardRuns)
	if !ok || s.stack.Status.CurrentRun == "" {
		return nil
	}
	pod, err := runs.OtherShardRun(ctx, s.stack.Namespace, s.stack.Name, s.stack.Status.CurrentRun)
	if err != nil || pod == "" {
		return err
	}
	return outcome.Waiting(OtherShardRunReason, otherShardRecheck,
		fmt.Errorf("run %s, started by another controller shard before the Stack moved to this one, goes on in runner pod %s; this shard runs the Stack once it ends", s.stack.Status.CurrentRun, pod))
}

// OtherShardRun implements shardRuns.
func (l LauncherRuns) OtherShardRun(ctx context.Context, namespace, stack, runID string) (string, error) {
	return l.Launcher.OtherShardRun(ctx, namespace, stack, runID)
}
