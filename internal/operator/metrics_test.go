package operator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestMetricsNeedAnAuthorizedCaller is the attack of a tenant (or anyone on
// the pod network) reading every tenant's namespace and Stack names from the
// controller's metrics: the metrics server as the controller builds it
// (metricsServerOptions), against a real API server, serves nothing to a
// scrape without a token (401), with a token the API server rejects, or by
// a ServiceAccount not granted terrace-metrics-reader (403), and does not
// answer plain HTTP; it serves a ServiceAccount bound to
// config/rbac/metrics_reader_role.yaml over TLS that verifies against the
// controller's CA by the Service's name.
func TestMetricsNeedAnAuthorizedCaller(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}

	// The shipped ClusterRole, exactly as config/rbac has it.
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "metrics_reader_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(raw, role); err != nil {
		t.Fatal(err)
	}
	if role.Name != MetricsReaderRole {
		t.Fatalf("config/rbac/metrics_reader_role.yaml names %q, want %q", role.Name, MetricsReaderRole)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	scraper := serviceAccountToken(t, cs, ns, "prometheus")
	tenant := serviceAccountToken(t, cs, ns, "tenant")
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-terrace-metrics-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: MetricsReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: "terrace_metrics_auth_probe", Help: "a gauge only this test registers"})
	if err := crmetrics.Registry.Register(probe); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { crmetrics.Registry.Unregister(probe) })

	authority, err := pki.NewAuthority(24 * time.Hour * 30)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.Namespace = "terrace-system"
	serving := pki.NewIssuedCertificate(authority, pki.LeafRequest{Identity: pki.ControllerIdentity, DNSNames: o.ServingDNSNames()})
	addr := startMetricsServer(t, env.Config, metricsServerOptions("127.0.0.1:0", o.MetricsSecure, serving))

	current, _ := authority.CAs()
	roots := x509.NewCertPool()
	roots.AddCert(current.Certificate())
	verified := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, ServerName: "terrace-controller.terrace-system.svc", MinVersion: tls.VersionTLS12,
	}}}
	scrape := func(c *http.Client, scheme, token string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, scheme+"://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}

	if code, body, err := scrape(verified, "https", ""); err != nil || code != http.StatusUnauthorized || strings.Contains(body, "terrace_metrics_auth_probe") {
		t.Errorf("a scrape without a token: %d %v\n%s", code, err, body)
	}
	// controller-runtime's filter answers 500 when the TokenReview says the
	// token is invalid; what matters is that nothing is served.
	if code, body, err := scrape(verified, "https", "not-a-token"); err != nil || code == http.StatusOK || strings.Contains(body, "terrace_metrics_auth_probe") {
		t.Errorf("a scrape with a token the API server does not accept: %d %v\n%s", code, err, body)
	}
	if code, body, err := scrape(verified, "https", tenant); err != nil || code != http.StatusForbidden || strings.Contains(body, "terrace_metrics_auth_probe") {
		t.Errorf("a scrape by a ServiceAccount without terrace-metrics-reader: %d %v\n%s", code, err, body)
	}
	plain := &http.Client{Timeout: 30 * time.Second}
	if code, body, err := scrape(plain, "http", scraper); err == nil && code == http.StatusOK {
		t.Errorf("plain HTTP was served:\n%s", body)
	}
	code, body, err := scrape(verified, "https", scraper)
	if err != nil || code != http.StatusOK || !strings.Contains(body, "terrace_metrics_auth_probe") {
		t.Fatalf("a scrape by the reader: %d %v\n%s", code, err, body)
	}
}

// startMetricsServer runs a metrics server with opts until the test ends
// and returns its address once it answers.
func startMetricsServer(t *testing.T, cfg *rest.Config, opts metricsserver.Options) string {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(opts, cfg, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("metrics server: %v", err)
		}
	})
	bound, ok := srv.(interface{ GetBindAddr() string })
	if !ok {
		t.Fatalf("%T does not say where it listens", srv)
	}
	var addr string
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case err := <-done:
			done <- err // for the cleanup
			return false, fmt.Errorf("the metrics server stopped: %w", err)
		default:
		}
		addr = bound.GetBindAddr()
		return addr != "" && !strings.HasSuffix(addr, ":0"), nil
	})
	if err != nil {
		t.Fatalf("the metrics server is not listening: %v", err)
	}
	return addr
}

// serviceAccountToken creates a ServiceAccount in ns and returns a token of it.
func serviceAccountToken(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(fmt.Errorf("failed to create a token of %s/%s: %w", ns, name, err))
	}
	return tr.Status.Token
}
