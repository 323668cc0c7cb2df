package apiserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/controller/config"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/testenv"
)

var env *testenv.Env

// oidcProvider is an OpenID Connect provider whose ID tokens (audience
// oidcClientID) envtest's kube-apiserver accepts, as user oidc:alice.
var oidcProvider *testenv.OIDCProvider

const oidcClientID = "terrace-console"

func TestMain(m *testing.M) {
	p, err := testenv.StartOIDCProvider(oidcClientID, "alice")
	if err != nil {
		fmt.Fprintln(os.Stderr, "oidc provider:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "apiserver-oidc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	authn, err := p.AuthenticationConfig(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	oidcProvider = p
	testenv.MainWith(m, &env, testenv.Options{
		APIServerArgs: map[string]string{"authentication-config": authn},
		AfterStop:     func() { p.Close(); _ = os.RemoveAll(dir) },
	})
}

// apiTest is a running Installations API for one namespace, and the
// tokens of two ServiceAccounts: one allowed stacks and secrets, one nothing.
type apiTest struct {
	t         *testing.T
	namespace string
	url       string
	http      *http.Client
	admin     string
	nobody    string
	// serverConfig is the server's own identity: ServiceAccount terrace-api
	// bound to the Role the controller makes (config.APIServerRole).
	serverConfig *rest.Config
	// log is what the server logged.
	log *testenv.SyncBuffer
}

// installerRules are what the docs tell a tool's Role to grant.
var installerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
}

// newAPITest starts the server in-process on 127.0.0.1 over TLS with a
// self-signed certificate, as `terrace api` does.
func newAPITest(t *testing.T) *apiTest {
	t.Helper()
	return newAPITestWith(t, nil)
}

// newAPITestWith is newAPITest with the server changed by configure first.
func newAPITestWith(t *testing.T, configure func(*Server)) *apiTest {
	t.Helper()
	ns := env.Namespace(t)
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	at := &apiTest{t: t, namespace: ns, log: &testenv.SyncBuffer{}}
	at.admin = serviceAccountToken(t, clientset, ns, "installer", installerRules)
	at.nobody = serviceAccountToken(t, clientset, ns, "nobody", nil)
	at.serverConfig = apiServerIdentity(t, clientset, ns)

	certFile, keyFile, pool := selfSignedCert(t)
	own, err := client.New(at.serverConfig, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	caller, err := CallerClient(at.serverConfig, env.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	// As `terrace api` runs: the operator's state settings come as a flag,
	// another namespace's TerraceConfig is read as the caller.
	reader := SettingsReader(ConfigReader(own, caller, ns, "terrace-system"), "terrace-system", &terracev1.StateConfig{})
	resolver := &settings.Resolver{Reader: reader, OperatorNamespace: "terrace-system", Builtin: settings.BuiltinDefaults("")}
	stores := backend.New(caller, resolver.ResolveNamespace)
	t.Cleanup(stores.Close)
	srv := &Server{Namespace: ns, Client: own, Caller: caller, Stores: stores, Log: zap.New(zap.WriteTo(at.log))}
	if configure != nil {
		configure(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, TLSFiles{CertFile: certFile, KeyFile: keyFile}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	at.url = "https://" + ln.Addr().String()
	at.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return at
}

// apiServerIdentity makes the API server's ServiceAccount terrace-api in ns
// with the Role and RoleBinding the controller makes and returns a config
// that authenticates as it.
func apiServerIdentity(t *testing.T, cs kubernetes.Interface, ns string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, config.APIServerRole(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: config.APIName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: config.APIName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: config.APIName},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: config.APIName, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, config.APIName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}

// serviceAccountToken creates a ServiceAccount bound to a Role with rules
// (none: no binding) and returns a token for it from the TokenRequest API.
func serviceAccountToken(t *testing.T, cs kubernetes.Interface, ns, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if rules != nil {
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key, and
// returns their paths and a pool trusting the certificate.
func selfSignedCert(t *testing.T) (string, string, *x509.CertPool) {
	t.Helper()
	return testenv.ServingCert(t)
}

// do sends a request with token ("" for none) and body (nil for none) and
// returns the status and the body.
func (at *apiTest) do(token, method, path string, body any) (int, []byte) {
	at.t.Helper()
	var reader io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		reader = strings.NewReader(b)
	case []byte:
		reader = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			at.t.Fatal(err)
		}
		reader = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, at.url+path, reader)
	if err != nil {
		at.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := at.http.Do(req)
	if err != nil {
		at.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		at.t.Fatal(err)
	}
	return resp.StatusCode, raw
}

// expect sends a request and fails unless the status is want; it decodes
// the body into out when out is not nil.
func (at *apiTest) expect(want int, token, method, path string, body, out any) []byte {
	at.t.Helper()
	code, raw := at.do(token, method, path, body)
	if code != want {
		at.t.Fatalf("%s %s: status %d, want %d: %s", method, path, code, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			at.t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return raw
}

// expectError sends a request that must fail with want and a message holding every part.
func (at *apiTest) expectError(want int, token, method, path string, body any, parts ...string) {
	at.t.Helper()
	var e Error
	at.expect(want, token, method, path, body, &e)
	for _, part := range parts {
		if !strings.Contains(e.Message, part) {
			at.t.Fatalf("%s %s: message %q does not contain %q", method, path, e.Message, part)
		}
	}
}
