package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestNetworkPolicyLetsOnlyRunnersReachTheControllersServers installs
// config/default on the real node, whose NetworkPolicy enforcer applies the
// policy config/manager ships, and tries the state and artifact servers from
// another namespace, through the Service as a runner would: a pod with no
// runner labels is cut off, one labelled as Terrace labels its runners gets
// through, and a Stack still plans and applies in a runner pod.
func TestNetworkPolicyLetsOnlyRunnersReachTheControllersServers(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	dev := startTerraceDev(t, t.TempDir())
	defer dev.interrupt(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", dev.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the intruder namespace's ServiceAccount", func() error {
		_, err := cs.CoreV1().ServiceAccounts("intruder").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	runnerLabels := map[string]string{"app.kubernetes.io/managed-by": "terrace", "app.kubernetes.io/component": "runner"}
	for _, server := range []string{"terrace-controller.terrace-system.svc:9444", "terrace-controller.terrace-system.svc:9443"} {
		if phase, log := dialFromPod(t, cs, "intruder", nil, server); phase != corev1.PodFailed || !strings.Contains(log, "cannot reach") {
			t.Errorf("a pod of another namespace reached %s (%s): %s", server, phase, log)
		}
		if phase, log := dialFromPod(t, cs, "intruder", runnerLabels, server); phase != corev1.PodSucceeded {
			t.Errorf("a pod labelled as a runner could not reach %s (%s): %s", server, phase, log)
		}
	}

	objs, err := devcluster.ReadManifestFiles(filepath.Join(testenv.RepoRoot(), "examples"))
	if err != nil {
		t.Fatal(err)
	}
	progress := func(line string) { t.Log(line) }
	if err := devcluster.Apply(ctx, cfg, objs, progress); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	outcomes, err := devcluster.WaitAll(waitCtx, cfg, objs, progress)
	if err != nil {
		t.Fatalf("the examples did not become Ready under the NetworkPolicy: %v", err)
	}
	for _, o := range outcomes {
		if o.Health != devcluster.Current {
			t.Errorf("%s: %s %s", o.Ref(), o.Health, o.Message)
		}
	}
}

var dialPods int

// dialFromPod runs a pod of the Terrace image that connects once to target
// and returns how it ended and what it printed.
func dialFromPod(t *testing.T, cs kubernetes.Interface, ns string, labels map[string]string, target string) (corev1.PodPhase, string) {
	t.Helper()
	dialPods++
	name := fmt.Sprintf("dial-%d", dialPods)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: terraceImage, Args: []string{"dev", "pod-fixture", "--dial=" + target},
			}},
		},
	}
	return runPodToTheEnd(t, cs, pod, ns, 60*time.Second)
}

// runPodToTheEnd creates pod (restartPolicy Never) in ns, waits until it
// has succeeded or failed, and returns how it ended and what it printed.
func runPodToTheEnd(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, ns string, timeout time.Duration) (corev1.PodPhase, string) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := waitPod(t, cs, ns, pod.Name, timeout, "finished", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	log, err := podLogs(ctx, cs, ns, pod.Name, &corev1.PodLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return done.Status.Phase, log
}
