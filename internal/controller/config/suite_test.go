package config

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// The suite runs the real TerraceConfig reconciler in a manager against
// envtest, configured like the operator's (Secrets never cached).
var (
	env *testenv.Env
	// cached is the manager's cached client, as the Stack controller uses it.
	cached client.Client
)

// controllerImage is the controller's own image in these tests; the
// runner image (settings.BuiltinDefaults) is deliberately another.
const controllerImage = "ghcr.io/terrace-dev/terrace:controller-test"

// opNS is the operator namespace of the suite's controller.
const opNS = "terrace-system"

func tcfg(ns string, spec terracev1.TerraceConfigSpec) *terracev1.TerraceConfig {
	return &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: terracev1.TerraceConfigName}, Spec: spec}
}

func ptr[T any](v T) *T { return &v }

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	e, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	env = e
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "testenv: stop:", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNS}}); err != nil {
		fmt.Fprintln(os.Stderr, "failed to create the operator namespace:", err)
		return 1
	}

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Client:                 client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "failed to create manager:", err)
		return 1
	}
	cached = mgr.GetClient()
	resolver := &settings.Resolver{Reader: mgr.GetClient(), OperatorNamespace: opNS, Builtin: settings.BuiltinDefaults("ghcr.io/terrace-dev/terrace:test")}
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		fmt.Fprintln(os.Stderr, "failed to create a CA:", err)
		return 1
	}
	postgresHosts := &settings.PostgresHostPolicy{OperatorNamespace: opNS, Allowed: []string{"db"}, Reader: mgr.GetAPIReader()}
	if err := SetupWithManager(mgr, Options{Resolver: resolver, API: &APIServerSettings{Issuer: authority, Image: controllerImage}, PostgresHosts: postgresHosts}); err != nil {
		fmt.Fprintln(os.Stderr, "failed to set up the terraceconfig controller:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		fmt.Fprintln(os.Stderr, "cache did not sync")
		return 1
	}
	return m.Run()
}
