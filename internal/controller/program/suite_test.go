package program

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// The suite runs the real Program reconciler and the artifact server in one
// manager against envtest, the server on a loopback port with PKI certs.
var (
	env       *testenv.Env
	authority *pki.Authority
	baseURL   string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if onlyFuzzing() {
		// FuzzValidateFiles needs no cluster; a fuzz worker that started
		// one would pay for it at every restart.
		os.Exit(m.Run())
	}
	os.Exit(runSuite(m))
}

// onlyFuzzing says this process runs FuzzValidateFiles and no test: a fuzz
// worker, or `go test -run '^$' -fuzz ...`.
func onlyFuzzing() bool {
	flagValue := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return flagValue("test.fuzzworker") == "true" || (flagValue("test.fuzz") != "" && flagValue("test.run") == "^$")
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

	authority, err = pki.NewAuthority(30 * 24 * time.Hour)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	addr, err := freeLoopbackAddress()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	baseURL = "https://" + addr

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "failed to create manager:", err)
		return 1
	}
	serverCert := pki.NewIssuedCertificate(authority, pki.LeafRequest{Identity: pki.ControllerIdentity, Validity: time.Hour})
	server := artifactserver.NewServer(artifactserver.ServerOptions{ListenAddress: addr, BaseURL: baseURL}, mgr.GetCache(), mgr.GetAPIReader(), serverCert, authority)
	if err := mgr.Add(server); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := SetupWithManager(mgr, Options{ArtifactBaseURL: baseURL}); err != nil {
		fmt.Fprintln(os.Stderr, "failed to set up the program controller:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if err := waitForListener(addr, 30*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// waitForListener polls until something accepts connections on addr.
func waitForListener(addr string, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, nil
		}
		_ = c.Close()
		return true, nil
	})
}

func freeLoopbackAddress() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// httpClient is a client presenting a fresh leaf for id (none when id is
// empty) and trusting only the controller identity.
func httpClient(t *testing.T, id pki.Identity) *http.Client {
	t.Helper()
	var source pki.CertificateSource
	if id != "" {
		leaf, err := authority.Issue(pki.LeafRequest{Identity: id, Validity: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cert, err := leaf.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		source = pki.StaticCertificate(cert)
	}
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(source, authority, pki.ControllerIdentity)},
	}
}
