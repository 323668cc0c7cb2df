package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// This file keeps the release history in line with the state: every
// release records the serial of the state it left, and a run that finds
// nothing to change checks that the history names the state the Stack is
// at. Two things can leave them apart, both seen under faults (issue 16):
// the status patch that named a new release was lost (kube-apiserver
// restarting), or an apply was finished by a runner whose controller died,
// so no reconcile recorded it.

// The messages of a release recorded from the state: when other releases
// exist, an apply finished unrecorded; when none does, the state came
// first (adopted from tofu-controller or another backend, or the first
// apply's record was lost).
const (
	recordedFromState = "recorded from the state: an apply finished after the controller that started it stopped"
	recordedFromFirst = "recorded from the state: the Stack's state existed before any release (adopted, or the first apply's record was lost)"
)

// recordRelease stores rel as the Stack's next release, after the one its
// status names, without listing the Stack's records (release.RecordAfter).
func (r *Reconciler) recordRelease(ctx context.Context, s *scope, rel release.Release) (*release.Release, error) {
	rel.StateSerial = r.stateSerialAfterRun(ctx, s)
	return s.run.stores.History.RecordAfter(ctx, rel, previousRelease(s.recorded().Release))
}

func previousRelease(st *terracev1.ReleaseStatus) release.Previous {
	if st == nil {
		return release.Previous{}
	}
	return release.Previous{Revision: int(st.Revision), Deployed: st.Status == string(release.StatusDeployed)}
}

// stateSerialAfterRun reads the serial of the Stack's current state (the
// run's one read of it, stateAfterRun); 0 when there is none or it cannot be
// read, which the next run's check repairs.
func (r *Reconciler) stateSerialAfterRun(ctx context.Context, s *scope) int64 {
	serial, _, err := currentStateSerial(context.WithoutCancel(ctx), s)
	if err != nil {
		s.log.Error(err, "failed to read the state's serial for the release record")
	}
	return serial
}

// currentStateSerial is the serial of the current state as the run left
// it; found is false when the Stack has no state yet.
func currentStateSerial(ctx context.Context, s *scope) (serial int64, found bool, err error) {
	if ownsBackend(s.stack) {
		return 0, false, nil // its state is not Terrace's to read
	}
	st, err := stateAfterRun(ctx, s)
	if errors.Is(err, state.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("failed to read the state's serial: %w", err)
	}
	return st.Serial, true, nil
}

// reconcileRelease runs after a plan without changes: the inputs are
// applied, so the deployed release must be the one that left the current
// state. When the status already says so, that costs one read of the
// state's index; otherwise the history is listed, and the status names
// the release that matches, or a release is recorded for the state.
func (r *Reconciler) reconcileRelease(ctx context.Context, s *scope) error {
	serial, found, err := currentStateSerial(ctx, s)
	if err != nil || !found {
		return err
	}
	if st := s.recorded().Release; st != nil && st.Status == string(release.StatusDeployed) && st.StateSerial == serial {
		return nil
	}
	history := s.run.stores.History
	all, err := history.List(ctx, s.stack.Namespace, s.stack.Name)
	if err != nil {
		return fmt.Errorf("failed to list the release history: %w", err)
	}
	deployed := slices.IndexFunc(all, func(rel release.Release) bool { return rel.Status == release.StatusDeployed })
	if deployed >= 0 && (all[deployed].StateSerial == serial || all[deployed].StateSerial == 0) {
		// The status fell behind, or named a failed apply that changed
		// nothing. A record from before serials were kept is taken as
		// the one that left this state.
		rel := all[deployed]
		rel.StateSerial = serial
		s.observed.release = &rel
		return nil
	}
	prev := release.Previous{}
	if n := len(all); n > 0 {
		prev = release.Previous{Revision: all[n-1].Revision, Deployed: all[n-1].Status == release.StatusDeployed}
	}
	rel := r.releaseFromState(ctx, s, serial)
	if len(all) == 0 {
		rel.Message = recordedFromFirst
	}
	recorded, err := history.RecordAfter(ctx, rel, prev)
	if err != nil {
		return fmt.Errorf("failed to record the release of state serial %d: %w", serial, err)
	}
	s.observed.release = recorded
	r.normalEvent(s.stack, "ReleaseRecorded", "release %d for state serial %d, which no release named, %s", recorded.Revision, serial, rel.Message)
	return nil
}

// releaseFromState is the record of a state no release names: the
// current inputs, which the plan just found applied. What that apply's
// plan was is not known; its outputs are read from the runner.
func (r *Reconciler) releaseFromState(ctx context.Context, s *scope, serial int64) release.Release {
	now := r.now()
	rel := release.Release{
		Namespace: s.stack.Namespace, Stack: s.stack.Name, Status: release.StatusDeployed,
		SourceRevision: s.source.revision, StartedAt: now, FinishedAt: now,
		ToolVersion: s.observed.tool.version, RunnerImage: s.observed.tool.image,
		Message: recordedFromState, StateSerial: serial, SecretInputs: s.inputs.secretValues(),
	}
	if outputs, err := s.run.client.Outputs(ctx); err == nil {
		rel.Outputs = releaseOutputs(outputs)
	}
	return rel
}
