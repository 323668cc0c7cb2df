// Package testenv starts a real kube-apiserver and etcd (envtest) with
// Terrace's CRDs installed, for every integration test to share, and finds
// the tool binaries built by `make tools`.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/terrace-dev/terrace/internal/scheme"
)

// Tools are the binaries `make tools` builds (hack/tools/build.sh).
type Tools struct {
	// KubebuilderAssets holds etcd, kube-apiserver, kube-controller-manager and kubectl.
	KubebuilderAssets string
	// Tofu is the tofu binary.
	Tofu string
	// ProviderMirror is a CLI-config filesystem_mirror holding the test provider.
	ProviderMirror string
	// FluxBin holds Flux's source-controller, its CRDs (crds/) and the git
	// server (gitserver) of the end-to-end test that runs them.
	FluxBin string
	// GiteaBin holds the gitea binary and the templates, options and
	// public files it reads (static/), for the tests that run Gitea.
	GiteaBin string
}

// RepoRoot returns the checkout's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// FindTools locates the tool binaries: the environment first
// (KUBEBUILDER_ASSETS, TERRACE_TOFU, TERRACE_PROVIDER_MIRROR), then the cache
// that hack/tools/build.sh fills. It builds nothing.
func FindTools() (Tools, error) {
	out, err := exec.Command("bash", filepath.Join(RepoRoot(), "hack", "tools", "build.sh"), "--env").Output()
	if err != nil {
		return Tools{}, fmt.Errorf("failed to ask hack/tools/build.sh where the tools are: %w", err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vars[k] = v
		}
	}
	t := Tools{KubebuilderAssets: vars["KUBEBUILDER_ASSETS"], Tofu: vars["TERRACE_TOFU"], ProviderMirror: vars["TERRACE_PROVIDER_MIRROR"], FluxBin: vars["TERRACE_FLUX_BIN"], GiteaBin: vars["TERRACE_GITEA_BIN"]}
	for _, bin := range []string{filepath.Join(t.KubebuilderAssets, "kube-apiserver"), filepath.Join(t.KubebuilderAssets, "etcd")} {
		if _, err := os.Stat(bin); err != nil {
			return t, fmt.Errorf("%s is missing: run `make tools` (a cold build takes ~25 minutes) or set KUBEBUILDER_ASSETS", bin)
		}
	}
	return t, nil
}

// RequireTofu returns the tofu binary or fails the test with what to do.
func RequireTofu(tb testing.TB) string {
	tb.Helper()
	t, _ := FindTools()
	if t.Tofu == "" {
		tb.Fatal("no tofu binary known: run `make tools`")
	}
	if _, err := os.Stat(t.Tofu); err != nil {
		tb.Fatalf("tofu binary %s is missing: run `make tools`", t.Tofu)
	}
	return t.Tofu
}

// Env is a running envtest API server with the Terrace CRDs installed.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	Tools  Tools

	env *envtest.Environment
}

// NewScheme returns a scheme with the built-in kinds and Terrace's.
func NewScheme() *k8sruntime.Scheme { return scheme.New() }

// Start starts etcd and kube-apiserver and installs config/crd/bases.
// Call it from TestMain and Stop the result when the tests end.
func Start() (*Env, error) { return StartWith(Options{}) }

// Options change the environment's kube-apiserver.
type Options struct {
	// APIServerArgs are set on kube-apiserver's command line (name without
	// dashes → value), e.g. "authentication-config" for an OIDCProvider.
	APIServerArgs map[string]string
	// AfterStop runs once the environment has stopped (MainWith).
	AfterStop func()
}

// StartWith is Start with opts.
func StartWith(opts Options) (*Env, error) {
	tools, err := FindTools()
	if err != nil {
		return nil, err
	}
	scheme := NewScheme()
	env := &envtest.Environment{
		BinaryAssetsDirectory: tools.KubebuilderAssets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		// envtest's 20 s is too short for kube-apiserver on a loaded
		// machine: every start of a package then failed at load 15-50.
		env.ControlPlaneStartTimeout = 2 * time.Minute
	}
	for name, value := range opts.APIServerArgs {
		env.ControlPlane.GetAPIServer().Configure().Set(name, value)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("failed to start envtest: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("failed to create client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, Tools: tools, env: env}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// Kubeconfig writes a kubeconfig for the API server into dir and returns its path.
func (e *Env) Kubeconfig(dir string) (string, error) {
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "terrace-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// CreateUnstructured creates an object given as plain JSON-like data, for
// values that typed objects cannot express.
func (e *Env) CreateUnstructured(ctx context.Context, obj map[string]any) error {
	return e.Client.Create(ctx, &unstructured.Unstructured{Object: obj})
}

// Namespace creates a namespace with a generated name for one test and
// deletes it when the test ends.
func (e *Env) Namespace(tb testing.TB) string {
	tb.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Client.Create(ctx, ns); err != nil {
		tb.Fatalf("failed to create namespace: %v", err)
	}
	tb.Cleanup(func() { _ = e.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// Main is a TestMain body: it starts the environment, runs the tests, stops
// it and exits. A missing tool fails the package, never skips it.
func Main(m *testing.M, env **Env) { MainWith(m, env, Options{}) }

// MainWith is Main with opts.
func MainWith(m *testing.M, env **Env, opts Options) {
	e, err := StartWith(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		if opts.AfterStop != nil {
			opts.AfterStop()
		}
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stop:", err)
	}
	if opts.AfterStop != nil {
		opts.AfterStop()
	}
	os.Exit(code)
}
