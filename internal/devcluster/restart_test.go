package devcluster_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/terrace-dev/terrace/internal/devcluster"
)

// A restarted etcd keeps its data and a restarted API server its port: what
// was written before is read after, with the same client.
func TestRestartKeepsDataAndAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := devcluster.Start(ctx, devcluster.Options{BinDir: binDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cs := kubernetes.NewForConfigOrDie(c.Config)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pids := c.Pids()
	for _, step := range []struct {
		component string
		kill      bool
	}{{"etcd", true}, {"kube-apiserver", false}} {
		if err := c.Restart(ctx, step.component, step.kill); err != nil {
			t.Fatalf("restart %s: %v", step.component, err)
		}
		waitFor(ctx, t, "the API server to serve after restarting "+step.component, func() bool {
			got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "before", metav1.GetOptions{})
			return err == nil && got.Data["k"] == "v"
		})
	}
	after := c.Pids()
	if len(after) != len(pids) || after[0] == pids[0] || after[1] == pids[1] {
		t.Errorf("processes before %v, after %v: want etcd and kube-apiserver replaced", pids, after)
	}
	if err := c.Restart(ctx, "kubelet", false); err == nil {
		t.Error("Restart accepted a component the cluster does not run")
	}
}
