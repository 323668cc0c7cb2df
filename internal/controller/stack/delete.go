package stack

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/state"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Reasons on deletion.
const (
	DestroyFailedReason = "DestroyFailed"
	DestroyingReason    = "Destroying"
)

// The deletion path: a Stack with destroyOnDelete whose inputs were ever
// applied is destroyed by a destroy run (the same actions as every run),
// then what Terrace stored for it is removed and the finalizer released.
// Without destroyOnDelete the resources and their state are deliberately
// kept.

// startDestroyRun starts the destroy run and runs it in this reconcile:
// the finalizer's removal follows it. It still needs a run slot, so one
// namespace's destroys hold fewer workers than there are.
func (r *Reconciler) startDestroyRun(ctx context.Context, s *scope) error {
	return r.startRun(ctx, s, runDestroy)
}

// finalizeDestroyed removes what Terrace stored for a destroyed Stack and
// releases the finalizer.
func (r *Reconciler) finalizeDestroyed(ctx context.Context, s *scope) error {
	if err := r.removeStoredData(ctx, s); err != nil {
		return err
	}
	r.normalEvent(s.stack, "Destroyed", "destroyed the Stack's resources and removed its state, plans, releases and outputs")
	return r.removeFinalizer(ctx, s)
}

// finalizeKeepingResources removes the Stack's runner pods and releases
// the finalizer, leaving the resources and their state in place.
func (r *Reconciler) finalizeKeepingResources(ctx context.Context, s *scope) error {
	stack := s.stack
	if err := r.Runs.Cleanup(ctx, stack.Namespace, stack.Name); err != nil {
		return fmt.Errorf("failed to remove runner pods: %w", err)
	}
	if stack.Status.LastAppliedInputsDigest != "" {
		r.warningEvent(stack, "ResourcesKept", "Stack deleted without destroyOnDelete: its resources are left in place and their state is kept (state Secrets of %s/%s, workspace %s)", stack.Namespace, stack.Name, stack.Spec.Workspace)
	}
	return r.removeFinalizer(ctx, s)
}

func (r *Reconciler) removeFinalizer(ctx context.Context, s *scope) error {
	controllerutil.RemoveFinalizer(s.stack, Finalizer)
	if err := r.Client.Update(ctx, s.stack); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to remove finalizer: %w", err)
	}
	return nil
}

// destroy is the command of destroy runs: `destroy` with the Stack's
// current inputs. Under plan policies the destruction is planned first,
// the policies decide that plan, and exactly it is applied.
func (r *Reconciler) destroy(_ context.Context, s *scope) error {
	ctx := runContext(s)
	vars, err := s.variables()
	if err != nil {
		return err
	}
	if s.hasPolicies() {
		if err := r.destroyChecked(ctx, s, vars); err != nil {
			return err
		}
		s.run.facts.stepDone = true
		return nil
	}
	// A destroy is an apply of the destruction, timed as one.
	defer s.run.timings.Start(runphase.Apply)()
	if err := s.run.client.Destroy(ctx, &runnerv1.DestroyRequest{Variables: vars}, s.run.logf); err != nil {
		return classify(s.run.session, err, DestroyFailedReason, "destroy failed")
	}
	s.run.facts.stepDone = true
	return nil
}

// destroyChecked plans the destruction, has the policies decide it and
// applies that plan. A denial destroys nothing and removes nothing: the
// state, plans and releases stay, and the deletion waits (deletionBlocked
// says how to go on).
func (r *Reconciler) destroyChecked(ctx context.Context, s *scope, vars *runnerv1.Variables) error {
	run := s.run
	planID := newPlanID(s)
	planDone := run.timings.Start(runphase.Plan)
	p, err := run.client.Plan(ctx, &runnerv1.PlanRequest{Variables: vars, PlanId: planID, Destroy: true, MaxStateBytes: r.Options.MaxStateBytes}, run.logf)
	planDone()
	if err != nil {
		return classify(run.session, err, DestroyFailedReason, "the destroy plan failed")
	}
	made := &planObservation{id: planID, summary: p.GetSummary(), hasChanges: p.GetHasChanges(), at: r.now(), destroy: true}
	s.observed.plan = made
	if err := r.checkPolicies(ctx, s, made, p); err != nil {
		var terminal *outcome.TerminalError
		if errors.As(err, &terminal) {
			return outcome.Terminalf(terminal.Reason, "the destroy %s; nothing was destroyed and the state, plans and releases are kept; change the plan policies (the deletion is retried when they change)", terminal.Err.Error())
		}
		return err
	}
	if !made.hasChanges {
		return nil
	}
	defer run.timings.Start(runphase.Apply)()
	if err := run.client.ApplyWith(ctx, applyRequest(s, planID), run.logf); err != nil {
		return classify(run.session, err, DestroyFailedReason, "destroy failed")
	}
	return nil
}

// removeStoredData deletes the Stack's state, plans, releases and outputs Secret.
func (r *Reconciler) removeStoredData(ctx context.Context, s *scope) error {
	stores, err := r.openStores(ctx, s.stack.Namespace)
	if err != nil {
		return err
	}
	if !ownsBackend(s.stack) {
		if err := stores.States.Delete(ctx, stateKey(s.stack)); err != nil {
			return fmt.Errorf("failed to delete state: %w", err)
		}
	}
	plans, err := stores.Plans.ListPlans(ctx, s.stack.Namespace, s.stack.Name)
	if err != nil {
		return fmt.Errorf("failed to list plans: %w", err)
	}
	for _, p := range plans {
		if err := stores.Plans.DeletePlan(ctx, p.Key); err != nil && !errors.Is(err, state.ErrNotFound) {
			return fmt.Errorf("failed to delete plan %s: %w", p.Key.ID, err)
		}
	}
	if err := stores.History.DeleteAll(ctx, s.stack.Namespace, s.stack.Name); err != nil {
		return fmt.Errorf("failed to delete releases: %w", err)
	}
	// Only outputs Secrets Terrace made for this Stack, whatever the spec names.
	if err := r.removeOutputsSecrets(ctx, s, ""); err != nil {
		return err
	}
	return r.Stores.ForgetEmptyLocation(ctx, s.stack.Namespace)
}

// deletionBlocked says, in the error's own kind, that the Stack stays until
// the error is fixed, and how to leave the resources instead.
func deletionBlocked(err error) error {
	const format = "deletion blocked: %s; fix it, or remove the finalizer %s to leave the resources"
	var terminal *outcome.TerminalError
	var waiting *outcome.WaitingError
	switch {
	case errors.As(err, &terminal):
		return outcome.Terminalf(terminal.Reason, format, terminal.Err.Error(), Finalizer)
	case errors.As(err, &waiting):
		return outcome.Waiting(waiting.Reason, waiting.RequeueAfter, fmt.Errorf(format, waiting.Err.Error(), Finalizer))
	}
	return fmt.Errorf("deletion blocked, retrying (or remove the finalizer %s to leave the resources): %w", Finalizer, err)
}
