package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// runnerContainer is the runner pod's main container (internal/launcher names it so).
const runnerContainer = "runner"

func newLogsCommand() *cobra.Command {
	var follow, previous bool
	var tail int64
	cmd := &cobra.Command{
		Use:   "logs STACK",
		Short: "Print the logs of the Stack's running (else latest) runner pod",
		Long: "Prints the runner container's log of the Stack's running runner pod, or of its newest one.\n" +
			"Runner pods are deleted when their run ends unless the TerraceConfig sets spec.runner.retain: true,\n" +
			"so between runs there is usually nothing to show: the Stack's events and `terrace get` say how the\n" +
			"last run ended.",
		Example: "  terrace logs web -n team -f\n  terrace logs web -n team --previous",
		Args:    cobra.ExactArgs(1),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "stream the log until the pod ends or Ctrl-C")
	cmd.Flags().Int64Var(&tail, "tail", -1, "lines from the end to show (default: all)")
	cmd.Flags().BoolVarP(&previous, "previous", "p", false, "the runner pod of the run before the latest one (kept when spec.runner.retain is on)")
	return stackVerb(cmd, "", nil, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, _ string) error {
		cs, err := k.clientset()
		if err != nil {
			return err
		}
		pods, err := runnerPods(ctx, cs, stack)
		if err != nil {
			return err
		}
		if len(pods) == 0 {
			return noRunnerPodError(ctx, k, stack)
		}
		pod := pods[0]
		if previous {
			if len(pods) < 2 {
				return fmt.Errorf("Stack %s/%s has no runner pod before %s: only pods kept with spec.runner.retain: true remain after their run", stack.Namespace, stack.Name, pod.Name)
			}
			pod = pods[1]
		}
		fmt.Fprintf(s.err, "runner pod %s/%s (%s, run %s, created %s ago)\n", pod.Namespace, pod.Name, pod.Status.Phase, pod.Labels[launcher.LabelRun], age(pod.CreationTimestamp, time.Now()))
		opts := &corev1.PodLogOptions{Container: runnerContainer, Follow: follow}
		if tail >= 0 {
			opts.TailLines = &tail
		}
		stream, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, opts).Stream(ctx)
		if err != nil {
			return fmt.Errorf("failed to read the log of runner pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		defer func() { _ = stream.Close() }()
		if _, err := io.Copy(s.out, stream); err != nil && ctx.Err() == nil {
			return fmt.Errorf("failed to stream the log of runner pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return nil
	})
}

// runnerPods returns the Stack's runner pods, the running or pending one
// first, then newest first. Pods must be owned by this Stack (its UID), so a
// deleted and recreated Stack of the same name, or a long name sharing a
// shortened label, never shows another's log.
func runnerPods(ctx context.Context, cs kubernetes.Interface, stack *terracev1.Stack) ([]*corev1.Pod, error) {
	selector := labels.SelectorFromSet(labels.Set{
		launcher.LabelManagedBy: launcher.ManagedByTerrace,
		launcher.LabelComponent: launcher.ComponentRunner,
		launcher.LabelStack:     launcher.StackLabelValue(stack.Name),
	})
	list, err := cs.CoreV1().Pods(stack.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		return nil, describeAPIError(err, "runner pods of Stack "+stack.Namespace+"/"+stack.Name, stack.Namespace)
	}
	var pods []*corev1.Pod
	for i := range list.Items {
		if ownedBy(&list.Items[i], stack) {
			pods = append(pods, &list.Items[i])
		}
	}
	sort.SliceStable(pods, func(i, j int) bool {
		ai, aj := isActivePod(pods[i]), isActivePod(pods[j])
		if ai != aj {
			return ai
		}
		return pods[j].CreationTimestamp.Before(&pods[i].CreationTimestamp)
	})
	return pods, nil
}

func ownedBy(pod *corev1.Pod, stack *terracev1.Stack) bool {
	for _, ref := range pod.OwnerReferences {
		if ref.UID == stack.UID {
			return true
		}
	}
	return false
}

// isActivePod is true for a pod whose run has not ended.
func isActivePod(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && (pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodPending)
}

// noRunnerPodError explains an empty result: pods go with their run unless retained.
func noRunnerPodError(ctx context.Context, k *kube, stack *terracev1.Stack) error {
	why := "runner pods are deleted when their run ends unless the TerraceConfig sets spec.runner.retain: true"
	if eff, err := k.resolver().Resolve(ctx, stack); err == nil && eff.Retain {
		why = "retain is on for this namespace, yet no pod is kept: the Stack has not run since retain was set, or its pod was deleted"
	}
	last := ""
	if ready := stackview.Condition(stack, terracev1.ReadyCondition); ready != nil {
		last = fmt.Sprintf("; last outcome: Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
	}
	return fmt.Errorf("no runner pod exists for Stack %s/%s: %s%s", stack.Namespace, stack.Name, why, last)
}
