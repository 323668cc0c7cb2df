package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/operator"
	"github.com/terrace-dev/terrace/internal/scheme"
	terraceclient "github.com/terrace-dev/terrace/pkg/client"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestInstallationsAPIOnASecondCluster is issue 14's "second dev control
// plane": a second dev cluster (its own control plane, node, registry,
// ports, pod and Service ranges, and directory) with its own Terrace controller is registered in the
// operator namespace's TerraceConfig as `second` (only the operator
// registers clusters: issue 44 item 3). An installation created through
// the API server of the first cluster with cluster: second, with the
// caller's token of that cluster, is applied by that cluster's controller;
// nothing is created in the first. An unknown cluster name is
// INVALID_ARGUMENT naming the known one, and nothing is created anywhere.
func TestInstallationsAPIOnASecondCluster(t *testing.T) {
	first := newStackEnv(t)
	second := startSecondCluster(t, first)
	ctx, cancel := context.WithTimeout(context.Background(), stackTimeout)
	defer cancel()

	// The second cluster: the namespace of the same name, the Program, and
	// a tool's identity there, allowed Stacks and Secrets as docs/api.md says.
	if err := second.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: second.ns}}); err != nil {
		t.Fatal(err)
	}
	second.program(t, "bench", map[string]string{"main.tf": benchModule})
	tokenThere := second.toolToken(t, "installer")

	// The first cluster's operator registers the second; the namespace runs
	// the API server, which is told the operator's clusters.
	first.registerCluster(t, terracev1.APICluster{
		Name: "second", Server: second.dev.Cluster.Config.Host, CABundle: string(second.dev.Cluster.Config.CAData),
	})
	first.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}},
	})
	podIP := first.readyAPIPod(t)
	api, err := terraceclient.New(fmt.Sprintf("https://%s:%d", podIP, config.APIPort),
		terraceclient.Options{Token: terraceclient.StaticToken(tokenThere), HTTPClient: first.apiHTTPClient(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Compared by name: a run's own TLS Secret goes with its pod by garbage
	// collection, so it may vanish in between; what must not happen is a new one.
	secretsBefore := map[string][]string{"first": secretNames(t, first), "second": secretNames(t, second)}

	created, err := api.Create(ctx, connect.NewRequest(&apiv1.CreateRequest{
		Cluster: "second", Name: "web", Source: &apiv1.Source{ProgramRef: "bench"},
		ApprovePlan: terracev1.ApprovePlanAuto, Values: mustStructE2E(t, map[string]any{"n": 2}),
	}))
	if err != nil {
		t.Fatalf("create in cluster second: %v", err)
	}
	if created.Msg.Cluster != "second" {
		t.Errorf("created: %v", created.Msg)
	}
	second.waitStack(t, "web", stackTimeout, "applied by the second cluster's controller", readyAt)
	got, err := api.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Cluster: "second", Name: "web"}))
	if err != nil || !got.Msg.Ready || got.Msg.Release != 1 {
		t.Errorf("the installation through the API: %v (%v)", got, err)
	}
	// Nothing in the first cluster: no Stack, no values Secret.
	if err := first.c.Get(ctx, client.ObjectKey{Namespace: first.ns, Name: "web"}, &terracev1.Stack{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Stack web in the first cluster: %v", err)
	}
	if added := newNames(secretsBefore["first"], secretNames(t, first)); len(added) > 0 {
		t.Errorf("the first cluster has new Secrets in %s: %v", first.ns, added)
	}
	if values := created.Msg.GetValuesSecret(); values == "" || second.c.Get(ctx, client.ObjectKey{Namespace: second.ns, Name: values}, &corev1.Secret{}) != nil {
		t.Errorf("values Secret %q is not in the second cluster", values)
	}

	// An unknown cluster: refused, naming the known one, before anything is made.
	secretsBefore = map[string][]string{"first": secretNames(t, first), "second": secretNames(t, second)}
	_, err = api.Create(ctx, connect.NewRequest(&apiv1.CreateRequest{
		Cluster: "nowhere", Name: "lost", Source: &apiv1.Source{ProgramRef: "bench"}, Values: mustStructE2E(t, map[string]any{"n": 3}),
	}))
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeInvalidArgument || terraceclient.Reason(err) != "UNKNOWN_CLUSTER" ||
		!strings.Contains(cerr.Message(), "the known ones are second") {
		t.Fatalf("an unknown cluster: %v", err)
	}
	for _, env := range []*stackEnv{first, second} {
		if err := env.c.Get(ctx, client.ObjectKey{Namespace: env.ns, Name: "lost"}, &terracev1.Stack{}); !apierrors.IsNotFound(err) {
			t.Errorf("a Stack lost in %s: %v", env.dev.Cluster.Config.Host, err)
		}
	}
	if added := newNames(secretsBefore["first"], secretNames(t, first)); len(added) > 0 {
		t.Errorf("the refused create left Secrets in the first cluster: %v", added)
	}
	if added := newNames(secretsBefore["second"], secretNames(t, second)); len(added) > 0 {
		t.Errorf("the refused create left Secrets in the second cluster: %v", added)
	}
}

// registerCluster adds c to the operator namespace's TerraceConfig
// spec.api.clusters until the test ends.
func (e *stackEnv) registerCluster(t *testing.T, c terracev1.APICluster) {
	t.Helper()
	change := func(update func(*terracev1.TerraceConfig)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cfg := &terracev1.TerraceConfig{}
			if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: operatorNamespace, Name: terracev1.TerraceConfigName}, cfg); err != nil {
				return err
			}
			if cfg.Spec.API == nil {
				cfg.Spec.API = &terracev1.APIConfig{}
			}
			update(cfg)
			return e.c.Update(context.Background(), cfg)
		})
	}
	if err := change(func(cfg *terracev1.TerraceConfig) { cfg.Spec.API.Clusters = append(cfg.Spec.API.Clusters, c) }); err != nil {
		t.Fatalf("failed to register cluster %s in the operator's TerraceConfig: %v", c.Name, err)
	}
	t.Cleanup(func() {
		err := change(func(cfg *terracev1.TerraceConfig) {
			cfg.Spec.API.Clusters = slices.DeleteFunc(cfg.Spec.API.Clusters, func(r terracev1.APICluster) bool { return r.Name == c.Name })
		})
		if err != nil {
			t.Errorf("failed to remove cluster %s from the operator's TerraceConfig: %v", c.Name, err)
		}
	})
}

// secretNames lists the Secrets of the env's namespace.
func secretNames(t *testing.T, e *stackEnv) []string {
	t.Helper()
	list := &corev1.SecretList{}
	if err := e.c.List(context.Background(), list, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(list.Items))
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	return names
}

// newNames lists the names of after that before lacks.
func newNames(before, after []string) []string {
	var added []string
	for _, name := range after {
		if !slices.Contains(before, name) {
			added = append(added, name)
		}
	}
	return added
}

// startSecondCluster starts a second dev cluster beside the shared one,
// with its own directory, free ports, pod addresses, registry and a
// Terrace controller of its own, for the test's life; it acts in the
// namespace of first's name.
func startSecondCluster(t *testing.T, first *stackEnv) *stackEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), devcluster.StartupTimeout)
	defer cancel()
	dev := startOwnDev(ctx, t, "e2e-second")
	if dev.Node.PodCIDR() == first.dev.Node.PodCIDR() {
		t.Fatalf("both dev clusters have pods in %s", dev.Node.PodCIDR())
	}
	// The first cluster's API server pod calls this cluster's API server,
	// on the host's end of this cluster's link: the one address outside
	// its own cluster the first node lets its pods reach.
	if err := first.dev.Reach(dev.Node.HostIP()); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(dev.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	second := &stackEnv{dev: dev, cs: cs, c: c, ns: first.ns}
	second.installOperatorConfig(t)
	startClusterController(t, dev)
	return second
}

// startClusterController runs a Terrace controller against dev until the
// test ends, on free ports of its own.
func startClusterController(t *testing.T, dev *devcluster.Dev) {
	t.Helper()
	ports := hostPorts(t, dev, 2)
	mgr, err := operator.NewManager(dev.Cluster.Config, operator.LocalOptions(operatorNamespace, ports[0], ports[1]))
	if err != nil {
		t.Fatalf("failed to create the second cluster's controller: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the second cluster's controller: %v", err)
		}
	})
}
