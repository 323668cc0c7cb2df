package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/operator"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/test/chart/chartrender"
)

// TestHelmChartShardsReconcileTheirOwnStacks installs the chart, unpatched,
// with sharding.shards [shard1, shard2] on the dev cluster's real node:
// three controller Deployments (the main one and one per shard), each its
// own leader. A Stack labelled sharding.fluxcd.io/key=shard1, one labelled
// shard2 and an unlabelled one all become Ready, and each Stack's runner
// pods carry the shard ID of the controller whose selector matches it, and
// no other (terrace.dev/shard, written by the controller that started the
// pod): each shard reconciled only its own Stacks. The runners of each
// shard reached that shard's own Service (terrace-controller-<shard>), the
// name its serving certificate carries.
func TestHelmChartShardsReconcileTheirOwnStacks(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	objects, err := chartrender.Render(testenv.RepoRoot(), map[string]any{
		"replicaCount": 1,
		"sharding":     map[string]any{"shards": []any{"shard1", "shard2"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rendered, err := json.Marshal(objects)
	if err != nil {
		t.Fatal(err)
	}
	tags := devcluster.ManifestImageTags(rendered)
	if len(tags) != 1 {
		t.Fatalf("the manifests name the Terrace image with tags %v, want one", tags)
	}
	controllers := map[string]*appsv1.Deployment{}
	for _, o := range objects {
		if o.GetKind() == "Deployment" {
			d := typed[appsv1.Deployment](t, nil, o)
			controllers[d.Name] = d
		}
	}
	selectors := map[string]string{ // Deployment → its --watch-label-selector
		"terrace-controller":        "!sharding.fluxcd.io/key",
		"terrace-controller-shard1": "sharding.fluxcd.io/key=shard1",
		"terrace-controller-shard2": "sharding.fluxcd.io/key=shard2",
	}
	if len(controllers) != len(selectors) {
		t.Fatalf("the chart renders %s", kinds(objects))
	}

	dev := startOwnDev(ctx, t, "deploy-shards", tags...)
	admin := dev.Cluster.Config
	cs := kubernetes.NewForConfigOrDie(admin)
	c, err := client.New(admin, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	var install []devcluster.Applied
	for _, o := range objects {
		install = append(install, devcluster.Applied{Object: o.DeepCopy(), Source: "the rendered manifests"})
	}
	env := &stackEnv{dev: dev, cs: cs, c: c}
	env.installOperatorConfig(t)
	if err := devcluster.Apply(ctx, admin, install, func(string) {}); err != nil {
		t.Fatalf("failed to apply the rendered manifests: %v", err)
	}

	// Each Deployment's pod is Ready and leads its own shard.
	for name, d := range controllers {
		selector := metav1.FormatLabelSelector(d.Spec.Selector)
		eventually(t, 4*time.Minute, name+"'s pod Ready and leading its shard", func() error {
			pods, err := cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return err
			}
			if len(pods.Items) != 1 {
				return fmt.Errorf("%d pods", len(pods.Items))
			}
			p := pods.Items[0]
			if len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
				return fmt.Errorf("pod %s not ready: %s", p.Name, p.Status.Phase)
			}
			logs, err := podLogs(ctx, cs, operatorNamespace, p.Name, &corev1.PodLogOptions{})
			if err != nil {
				return err
			}
			if !strings.Contains(logs, `"msg":"Starting workers"`) || !strings.Contains(logs, `"selector":"`+selectors[name]+`"`) {
				return fmt.Errorf("pod %s has not started its reconcilers for %s; its log ends:\n%s", p.Name, selectors[name], lastLines(logs, 5))
			}
			return nil
		})
	}

	env.ns = testNamespace(t, cs)
	shardOfPods := watchRunnerShards(ctx, t, cs, env.ns)
	env.program(t, "data", map[string]string{"main.tf": `
variable "who" { type = string }
resource "terraform_data" "note" { input = var.who }
output "note" { value = terraform_data.note.output }
`})
	stacks := map[string]string{"unlabelled": "", "one": "shard1", "two": "shard2"} // Stack → its shard label
	for name, shard := range stacks {
		st := &terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: terracev1.StackSpec{
				Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "data"}},
				Vars:          jsonVars(t, map[string]any{"who": name}),
				ApprovePlan:   terracev1.ApprovePlanAuto,
				RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
			},
		}
		if shard != "" {
			st.Labels = map[string]string{operator.ShardingKey: shard}
		}
		env.create(t, st)
	}
	for name := range stacks {
		var last terracev1.Stack
		eventually(t, stackTimeout, "Stack "+name+" to be Ready", func() error {
			if err := c.Get(ctx, client.ObjectKey{Namespace: env.ns, Name: name}, &last); err != nil {
				return err
			}
			if err := readyAt(&last); err != nil {
				return fmt.Errorf("%w; conditions: %s", err, conditionsText(&last))
			}
			return nil
		})
	}
	seen := shardOfPods()
	for name, shard := range stacks {
		selector := selectors["terrace-controller"]
		if shard != "" {
			selector = selectors["terrace-controller-"+shard]
		}
		want, err := operator.ShardID(selector)
		if err != nil {
			t.Fatal(err)
		}
		got := seen[name]
		if len(got) != 1 || !got[want] {
			t.Errorf("Stack %s (shard %q): its runner pods were started by shards %v, want only %s (selector %s)", name, shard, got, want, selector)
		}
	}
	t.Logf("runner pods by Stack and shard ID: %v", seen)
}

// watchRunnerShards records, per Stack, the shard IDs on its runner pods.
func watchRunnerShards(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) func() map[string]map[string]bool {
	t.Helper()
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: launcher.LabelComponent + "=" + launcher.ComponentRunner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var mu sync.Mutex
	seen := map[string]map[string]bool{}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Labels[launcher.LabelStack] == "" {
				continue // a warm pod no run has claimed yet
			}
			mu.Lock()
			stack := p.Labels[launcher.LabelStack]
			if seen[stack] == nil {
				seen[stack] = map[string]bool{}
			}
			seen[stack][p.Labels[launcher.LabelShard]] = true
			mu.Unlock()
		}
	}()
	return func() map[string]map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]map[string]bool{}
		for k, v := range seen {
			out[k] = map[string]bool{}
			for id := range v {
				out[k][id] = true
			}
		}
		return out
	}
}
