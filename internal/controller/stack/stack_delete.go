package stack

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/state"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Reasons on deletion.
const (
	DestroyFailedReason = "DestroyFailed"
	DestroyingReason    = "Destroying"
)

// reconcileDelete destroys the Stack's resources when destroyOnDelete is set,
// removes what Terrace stored for it, and releases the finalizer. Without
// destroyOnDelete the resources and their state are deliberately kept.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) error {
	stack := s.stack
	if !controllerutil.ContainsFinalizer(stack, Finalizer) {
		return nil
	}
	// A cache that has not seen the finalizer go would destroy twice.
	current, err := r.cacheIsCurrent(ctx, stack)
	if err != nil {
		return err
	}
	if !current {
		s.observed.staleCache = true
		return nil
	}
	if err := r.Runs.Cleanup(ctx, stack.Namespace, stack.Name); err != nil {
		return fmt.Errorf("failed to remove runner pods: %w", err)
	}
	if stack.Spec.DestroyOnDelete && stack.Status.LastAppliedInputsDigest != "" {
		if err := r.destroy(ctx, s); err != nil {
			return err
		}
		if err := r.removeStoredData(ctx, s); err != nil {
			return err
		}
		r.event(stack, "Normal", "Destroyed", "destroyed the Stack's resources and removed its state, plans, releases and outputs")
	} else if stack.Status.LastAppliedInputsDigest != "" {
		r.event(stack, "Warning", "ResourcesKept", "Stack deleted without destroyOnDelete: its resources are left in place and their state is kept (state Secrets of %s/%s, workspace %s)", stack.Namespace, stack.Name, stack.Spec.Workspace)
	}
	controllerutil.RemoveFinalizer(stack, Finalizer)
	if err := r.Client.Update(ctx, stack); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to remove finalizer: %w", err)
	}
	return nil
}

// destroy runs `destroy` in a runner with the Stack's current inputs.
func (r *Reconciler) destroy(ctx context.Context, s *scope) error {
	for _, st := range []step{r.resolveSource, r.resolveConfig, r.gatherInputs} {
		if err := st(ctx, s); err != nil {
			return fmt.Errorf("cannot destroy: %w", err)
		}
	}
	if err := r.announceRun(ctx, s, runDestroy); err != nil {
		return err
	}
	stores, err := r.openStores(ctx, s.stack.Namespace)
	if err != nil {
		return err
	}
	if err := r.recoverFromDeadRuns(ctx, s, stores.States); err != nil {
		return err
	}
	sess, err := r.Runs.Start(ctx, runRequestFor(s))
	if err != nil {
		return fmt.Errorf("failed to start a runner for destroy: %w", err)
	}
	defer func() {
		if err := sess.Close(context.WithoutCancel(ctx)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "failed to remove runner pod")
		}
	}()
	rctx, cl, logf := sess.Context(), sess.Client(), runLogger(ctx, sess.ID())
	if err := r.loadSource(rctx, s, cl); err != nil {
		return err
	}
	if _, err := cl.Init(rctx, r.initRequest(s, sess.ID()), logf); err != nil {
		return classify(sess, err, DestroyFailedReason, "init for destroy failed")
	}
	req, err := r.planRequest(s, "")
	if err != nil {
		return err
	}
	if err := cl.Destroy(rctx, &runnerv1.DestroyRequest{Variables: req.Variables}, logf); err != nil {
		return classify(sess, err, DestroyFailedReason, "destroy failed")
	}
	return nil
}

// removeStoredData deletes the Stack's state, plans, releases and outputs Secret.
func (r *Reconciler) removeStoredData(ctx context.Context, s *scope) error {
	stores, err := r.openStores(ctx, s.stack.Namespace)
	if err != nil {
		return err
	}
	if err := stores.States.Delete(ctx, stateKey(s.stack)); err != nil {
		return fmt.Errorf("failed to delete state: %w", err)
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

// summarizeDelete reports a failed destroy; the finalizer stays until it works.
func (r *Reconciler) summarizeDelete(stack *terracev1.Stack, err error) reconcile.Outcome {
	if err == nil {
		return reconcile.Outcome{}
	}
	stack.Status.Failures++
	reconcile.MarkFalse(stack, terracev1.ReadyCondition, DestroyFailedReason, "deletion blocked: %s; fix it, or remove the finalizer %s to leave the resources", err.Error(), Finalizer)
	reconcile.MarkTrue(stack, terracev1.ReconcilingCondition, DestroyingReason, "retrying destroy")
	r.event(stack, "Warning", DestroyFailedReason, "%s", err.Error())
	return reconcile.Outcome{Result: ctrl.Result{RequeueAfter: retryBackoff(stack, stack.Status.Failures)}}
}
