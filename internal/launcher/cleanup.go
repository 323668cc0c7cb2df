package launcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
)

// deletePod deletes a run's pod (its Secret, owned by it, goes with it);
// at once, without a grace period, when nothing runs in it (Run.MarkIdle).
func (l *Launcher) deletePod(ctx context.Context, namespace, podName string, uid types.UID, idle bool) error {
	opts := metav1.DeleteOptions{}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if idle {
		opts.GracePeriodSeconds = ptr.To(int64(0))
	}
	err := l.opts.Client.CoreV1().Pods(namespace).Delete(ctx, podName, opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("failed to delete runner pod %s: %w", podName, err)
	}
	return nil
}

// deleteObjects removes a run's pod (when podName is set, only the one with
// uid when set) and Secret; objects already gone are fine.
func (l *Launcher) deleteObjects(ctx context.Context, namespace, podName string, uid types.UID, secretName string) error {
	var errs []error
	if podName != "" {
		if err := l.deletePod(ctx, namespace, podName, uid, false); err != nil {
			errs = append(errs, err)
		}
	}
	if secretName != "" {
		err := l.opts.Client.CoreV1().Secrets(namespace).Delete(ctx, secretName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("failed to delete runner Secret %s: %w", secretName, err))
		}
	}
	return errors.Join(errs...)
}

// deleteUnlessRetained deletes a runner pod read from the cache, on
// condition that it is still the object read (UID and resourceVersion).
// The cache may not show yet that the pod was marked retained since (by
// this Launcher's own Close a moment ago): on a conflict the pod is read
// again and judged afresh. deleted is false for a pod left in place.
func (l *Launcher) deleteUnlessRetained(ctx context.Context, pod *corev1.Pod) (deleted bool, err error) {
	pods := l.opts.Client.CoreV1().Pods(pod.Namespace)
	for range 3 {
		if pod.Annotations[AnnotationRetained] == "true" {
			return false, nil
		}
		uid, version := pod.UID, pod.ResourceVersion
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &version}})
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return true, nil
		case !apierrors.IsConflict(err):
			return false, fmt.Errorf("failed to delete runner pod %s: %w", pod.Name, err)
		}
		fresh, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("failed to read runner pod %s: %w", pod.Name, err)
		}
		if fresh.UID != uid {
			return false, nil // another pod of that name now: not this pass's to judge
		}
		pod = fresh
	}
	return false, nil
}

// Cleanup deletes the runner pods and TLS Secrets of a Stack that no run
// of this Launcher is using, such as those a restarted or former leader
// left mid-run. Deleting a pod stops its runner gracefully (tofu releases
// its lock if it can). Retained pods are kept.
func (l *Launcher) Cleanup(ctx context.Context, namespace, stack string) error {
	log := ctrl.LoggerFrom(ctx)
	keep := map[string]bool{}
	pods, err := l.pods.stackPods(ctx, namespace, stack)
	if err != nil {
		return err
	}
	var errs []error
	for _, pod := range pods {
		runID := pod.Labels[LabelRun]
		if l.isActive(activeKey(namespace, stack, runID)) || pod.Annotations[AnnotationRetained] == "true" {
			keep[runID] = true
			continue
		}
		if pod.DeletionTimestamp != nil {
			continue
		}
		log.Info("deleting runner pod of an earlier run", "pod", pod.Name, "runID", runID)
		deleted, err := l.deleteUnlessRetained(ctx, pod)
		if err != nil {
			errs = append(errs, err)
		}
		if !deleted {
			keep[runID] = true
		}
	}
	secrets, err := l.opts.Client.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector(stack, ComponentRunnerTLS)})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("failed to list runner Secrets of Stack %s/%s: %w", namespace, stack, err))...)
	}
	for _, s := range secrets.Items {
		runID := s.Labels[LabelRun]
		if keep[runID] || l.isActive(activeKey(namespace, stack, runID)) {
			continue
		}
		if err := l.deleteObjects(ctx, namespace, "", "", s.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CleanupRun is Cleanup for the hot path, after a run of the Stack that
// did not end with Close (its controller stopped mid-run): it deletes the
// Stack's runner pods that no run of this Launcher uses, read from the
// shared cache, and the TLS Secret of run runID by its name, so it lists
// nothing and, when nothing was left, makes no API call but the Secret's
// delete. Retained pods are kept; an empty runID deletes no Secret.
func (l *Launcher) CleanupRun(ctx context.Context, namespace, stack, runID string) error {
	pods, err := l.pods.stackPods(ctx, namespace, stack)
	if err != nil {
		return err
	}
	var errs []error
	for _, pod := range pods {
		podRun := pod.Labels[LabelRun]
		if l.isActive(activeKey(namespace, stack, podRun)) || pod.Annotations[AnnotationRetained] == "true" || pod.DeletionTimestamp != nil {
			continue
		}
		ctrl.LoggerFrom(ctx).Info("deleting runner pod of an earlier run", "pod", pod.Name, "runID", podRun)
		deleted, err := l.deleteUnlessRetained(ctx, pod)
		if err == nil && deleted {
			err = l.deleteObjects(ctx, namespace, "", "", secretName(pod.Name))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if runID != "" && !l.isActive(activeKey(namespace, stack, runID)) {
		if err := l.deleteObjects(ctx, namespace, "", "", secretName(PodName(stack, runID))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists the run IDs of the Stack's runner pods that no run of
// this Launcher uses and that are not retained, from the shared cache (no
// API call): when it is empty and the Stack's last run ended with Close,
// there is nothing to clean up.
func (l *Launcher) Leftovers(ctx context.Context, namespace, stack string) ([]string, error) {
	pods, err := l.pods.stackPods(ctx, namespace, stack)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, pod := range pods {
		runID := pod.Labels[LabelRun]
		if !l.isActive(activeKey(namespace, stack, runID)) && pod.Annotations[AnnotationRetained] != "true" {
			ids = append(ids, runID)
		}
	}
	return ids, nil
}

// selector matches a Stack's runner pods (or their Secrets).
func selector(stack, component string) string {
	return labels.SelectorFromSet(labels.Set{
		LabelManagedBy: ManagedByTerrace,
		LabelComponent: component,
		LabelStack:     StackLabelValue(stack),
	}).String()
}

// retain marks a finished run's pod as kept and deletes the Stack's older
// retained pods, so at most one per Stack accumulates.
func (l *Launcher) retain(ctx context.Context, namespace, stack, podName string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%s:"true"}}}`, strconv.Quote(AnnotationRetained))
	_, err := l.opts.Client.CoreV1().Pods(namespace).Patch(ctx, podName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to mark runner pod %s retained: %w", podName, err)
	}
	pods, err := l.pods.stackPods(ctx, namespace, stack)
	if err != nil {
		return err
	}
	var errs []error
	for _, pod := range pods {
		if pod.Name == podName || pod.Annotations[AnnotationRetained] != "true" {
			continue
		}
		if err := l.deleteObjects(ctx, namespace, pod.Name, pod.UID, secretName(pod.Name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ActiveRuns counts the runner pods in namespace that may still be running
// a run: not finished and not kept for debugging. A state migration waits
// until there are none.
func (l *Launcher) ActiveRuns(ctx context.Context, namespace string) (int, error) {
	pods, err := l.pods.namespacePods(ctx, namespace)
	if err != nil {
		return 0, err
	}
	active := 0
	for _, pod := range pods {
		if pod.Labels[LabelWarmClass] != "" && pod.Labels[LabelRun] == "" {
			continue // a warm pod no run has claimed cannot touch any state
		}
		finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		if !finished && pod.Annotations[AnnotationRetained] != "true" {
			active++
		}
	}
	return active, nil
}

// OtherShardRun names the Stack's run runID when another controller shard
// started its runner pod and the pod may still be running it (not
// finished, not being deleted, not retained): the Stack was moved to this
// shard while that run went on. The other shard finishes it (its servers
// answer it while it is the Stack's status.currentRun) and deletes the pod;
// until then this shard must not announce a run of its own, which would
// cut the running tofu off from its state. Empty when there is none. From
// the cache: no API call.
func (l *Launcher) OtherShardRun(ctx context.Context, namespace, stack, runID string) (string, error) {
	if runID == "" {
		return "", nil
	}
	pods, err := l.pods.stackPods(ctx, namespace, stack)
	if err != nil {
		return "", err
	}
	for _, pod := range pods {
		if pod.Labels[LabelRun] != runID || pod.Labels[LabelShard] == l.opts.Shard || l.isActive(activeKey(namespace, stack, runID)) {
			continue
		}
		finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		if !finished && pod.DeletionTimestamp == nil && pod.Annotations[AnnotationRetained] != "true" {
			return pod.Name, nil
		}
	}
	return "", nil
}
