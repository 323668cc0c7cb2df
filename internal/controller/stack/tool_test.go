package stack

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/terrace-dev/terrace/internal/scheme"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

func runnerPodWith(status ...corev1.ContainerStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web-run-1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runner", Image: "ghcr.io/terrace-dev/terrace:v0.1.0"}}},
		Status:     corev1.PodStatus{ContainerStatuses: status},
	}
}

func TestRunnerImageIsRecordedByDigestWhenKnown(t *testing.T) {
	digest := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"containerd", runnerPodWith(corev1.ContainerStatus{Name: "runner", Image: "ghcr.io/terrace-dev/terrace:v0.1.0", ImageID: "ghcr.io/terrace-dev/terrace@" + digest}), "ghcr.io/terrace-dev/terrace@" + digest},
		{"docker", runnerPodWith(corev1.ContainerStatus{Name: "runner", Image: "terrace:v0.1.0", ImageID: "docker-pullable://ghcr.io/terrace-dev/terrace@" + digest}), "ghcr.io/terrace-dev/terrace@" + digest},
		{"no digest", runnerPodWith(corev1.ContainerStatus{Name: "runner", Image: "terrace:dev", ImageID: ""}), "terrace:dev"},
		{"not started", runnerPodWith(), "ghcr.io/terrace-dev/terrace:v0.1.0"},
	}
	for _, c := range cases {
		if got := runnerImage(c.pod); got != c.want {
			t.Errorf("%s: runnerImage = %q, want %q", c.name, got, c.want)
		}
	}
}

// namedSession is a live run whose pod can be named.
type namedSession struct {
	liveSession
	pod types.NamespacedName
}

func (n namedSession) Pod() types.NamespacedName { return n.pod }

func TestRunToolReadsTheVersionAndThePodsImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	pod := runnerPodWith(corev1.ContainerStatus{Name: "runner", ImageID: "ghcr.io/terrace-dev/terrace@" + digest})
	r := &Reconciler{APIReader: fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(pod).Build()}
	init := &runnerv1.InitResult{Version: "1.12.6"}

	tool := r.runTool(context.Background(), namedSession{pod: types.NamespacedName{Namespace: "team", Name: "web-run-1"}}, init)
	if tool.version != "1.12.6" || tool.image != "ghcr.io/terrace-dev/terrace@"+digest {
		t.Fatalf("runTool = %+v", tool)
	}
	// A pod that is gone, or a session without one, still gives the version.
	tool = r.runTool(context.Background(), namedSession{pod: types.NamespacedName{Namespace: "team", Name: "gone"}}, init)
	if tool.version != "1.12.6" || tool.image != "" {
		t.Fatalf("runTool of a gone pod = %+v", tool)
	}
	if tool = r.runTool(context.Background(), liveSession{}, init); tool.version != "1.12.6" {
		t.Fatalf("runTool without a pod = %+v", tool)
	}
}

// observedSession is a run whose launcher watched its pod.
type observedSession struct {
	namedSession
	observed *corev1.Pod
}

func (o observedSession) ObservedPod() *corev1.Pod { return o.observed }

// The pod the launcher's watch saw running names its image: no API call.
// A pod seen before its container reported an image is read from the API.
func TestRunToolTakesTheImageFromTheWatchedPod(t *testing.T) {
	digest := "sha256:" + strings.Repeat("cd", 32)
	seen := runnerPodWith(corev1.ContainerStatus{Name: "runner", ImageID: "ghcr.io/terrace-dev/terrace@" + digest})
	// The API reader has no pod: a read would leave the image empty.
	r := &Reconciler{APIReader: fake.NewClientBuilder().WithScheme(scheme.New()).Build()}
	init := &runnerv1.InitResult{Version: "1.12.6"}
	sess := observedSession{namedSession: namedSession{pod: types.NamespacedName{Namespace: "team", Name: "web-run-1"}}, observed: seen}
	if tool := r.runTool(context.Background(), sess, init); tool.image != "ghcr.io/terrace-dev/terrace@"+digest {
		t.Fatalf("runTool = %+v, want the image of the watched pod", tool)
	}
	live := runnerPodWith(corev1.ContainerStatus{Name: "runner", ImageID: "ghcr.io/terrace-dev/terrace@" + digest})
	r.APIReader = fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(live).Build()
	sess.observed = runnerPodWith()
	if tool := r.runTool(context.Background(), sess, init); tool.image != "ghcr.io/terrace-dev/terrace@"+digest {
		t.Fatalf("runTool = %+v, want the image read from the API when the watch had none", tool)
	}
}
