package apiserver

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/terrace-dev/terrace/internal/launcher"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// maxLogLines bounds GetRunLog (and is its default).
const maxLogLines = 2000

// PodLogReader reads a runner pod and its log as the call's caller.
type PodLogReader interface {
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	Log(ctx context.Context, namespace, name string, tailLines int64) ([]byte, error)
}

// CallerPodLogs is the PodLogReader of cfg's cluster that, like
// CallerClient, sends only the token of the call a request is made for.
func CallerPodLogs(cfg *rest.Config) (PodLogReader, error) {
	anonymous := rest.AnonymousClientConfig(cfg)
	httpClient, err := rest.HTTPClientFor(anonymous)
	if err != nil {
		return nil, fmt.Errorf("failed to create an HTTP client: %w", err)
	}
	httpClient.Transport = &callerTransport{next: httpClient.Transport}
	cs, err := kubernetes.NewForConfigAndClient(anonymous, httpClient)
	if err != nil {
		return nil, fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	return podLogs{cs}, nil
}

type podLogs struct{ cs kubernetes.Interface }

func (p podLogs) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return p.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (p podLogs) Log(ctx context.Context, namespace, name string, tailLines int64) ([]byte, error) {
	stream, err := p.cs.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{Container: "runner", TailLines: &tailLines}).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.Close() }()
	return io.ReadAll(io.LimitReader(stream, maxBodyBytes))
}

// GetRunLog returns the end of the latest run's runner log. Runner pods go
// with their run unless the TerraceConfig retains them, so between runs the
// answer is usually an empty text and a note saying so.
func (s *service) GetRunLog(ctx context.Context, req *connect.Request[apiv1.GetRunLogRequest]) (*connect.Response[apiv1.RunLog], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	if c.site.Cluster != "" || s.PodLogs == nil {
		return nil, failure(connect.CodeUnavailable, reasonStoreMisconfigured, "this server cannot read runner logs of cluster "+c.site.Cluster+": use `terrace logs` there")
	}
	tail := int64(req.Msg.GetTailLines())
	if tail <= 0 || tail > maxLogLines {
		tail = maxLogLines
	}
	stack, err := c.site.stack(ctx, c.name)
	if err != nil {
		return nil, err
	}
	// The latest run, in progress or not: currentRun is cleared when a run
	// ends, and was all there was before lastRun.
	out := &apiv1.RunLog{Run: stack.Status.LastRun}
	if out.Run == "" {
		out.Run = stack.Status.CurrentRun
	}
	if out.Run == "" {
		out.Note = "no run has started yet"
		return connect.NewResponse(out), nil
	}
	out.Pod = launcher.PodName(stack.Name, out.Run)
	pod, err := s.PodLogs.Pod(ctx, c.site.Namespace, out.Pod)
	switch {
	case apierrors.IsNotFound(err):
		out.Note = fmt.Sprintf("run %s has ended and its runner pod is gone (set spec.runner.retain: true in the TerraceConfig to keep runner pods)", out.Run)
		return connect.NewResponse(out), nil
	case err != nil:
		return nil, kubeError(err, "runner pod "+out.Pod)
	}
	if !ownedByStack(pod, string(stack.UID)) {
		return nil, notFound(fmt.Sprintf("pod %s is not a runner pod of Stack %s", out.Pod, stack.Name))
	}
	out.Active = pod.DeletionTimestamp == nil && (pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodPending)
	text, err := s.PodLogs.Log(ctx, c.site.Namespace, out.Pod, tail)
	if err != nil {
		if apierrors.IsBadRequest(err) && pod.Status.Phase == corev1.PodPending {
			out.Note = "the runner pod is starting"
			return connect.NewResponse(out), nil
		}
		return nil, kubeError(err, "the log of runner pod "+out.Pod)
	}
	out.Text = string(text)
	return connect.NewResponse(out), nil
}

func ownedByStack(pod *corev1.Pod, uid string) bool {
	for _, ref := range pod.OwnerReferences {
		if string(ref.UID) == uid {
			return true
		}
	}
	return false
}
