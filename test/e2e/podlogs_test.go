package e2e

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// podLogCollector keeps the log of one container of every pod of a
// namespace, streamed while the container runs: the kubelet removes a
// container's log with its pod, and runner pods are deleted after their
// run.
type podLogCollector struct {
	mu   sync.Mutex
	logs map[string]*bytes.Buffer
}

// collectPodLogs follows container in every pod of ns, present or future,
// until the test ends.
func collectPodLogs(t testing.TB, cs kubernetes.Interface, ns, container string) *podLogCollector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &podLogCollector{logs: map[string]*bytes.Buffer{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); w.Stop(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || !containerStarted(pod, container) {
				continue
			}
			c.mu.Lock()
			_, following := c.logs[pod.Name]
			buf := &bytes.Buffer{}
			if !following {
				c.logs[pod.Name] = buf
			}
			c.mu.Unlock()
			if following {
				continue
			}
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				stream, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container, Follow: true}).Stream(ctx)
				if err != nil {
					return
				}
				defer func() { _ = stream.Close() }()
				_, _ = io.Copy(&lockedWriter{mu: &c.mu, w: buf}, stream)
			}(pod.Name)
		}
	}()
	return c
}

// get returns what pod's container logged so far.
func (c *podLogCollector) get(pod string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if buf, ok := c.logs[pod]; ok {
		return buf.String()
	}
	return ""
}

// containerStarted reports whether the pod's container runs or ran.
func containerStarted(pod *corev1.Pod, container string) bool {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container {
			return st.State.Running != nil || st.State.Terminated != nil
		}
	}
	return false
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
