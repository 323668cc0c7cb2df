package runnercmd

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestRunnerCommandServesAndRemovesItsWorkDirOnShutdown(t *testing.T) {
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	runnerID := pki.RunnerIdentity("team-a", "web", "run-1")
	tlsDir := t.TempDir()
	leaf, err := authority.Issue(pki.LeafRequest{Identity: runnerID, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.WriteFiles(tlsDir); err != nil {
		t.Fatal(err)
	}
	workBase := t.TempDir()
	o := runnerOptions{
		listen: freeAddr(t), healthListen: freeAddr(t), tlsDir: tlsDir, workDir: workBase,
		binary: "tofu", binaryPath: "/bin/true", maxArchiveBytes: 1 << 20, maxPlanFileBytes: 1 << 20, interruptGrace: time.Second,
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- runRunner(ctx, o) }()

	controllerLeaf, err := authority.Issue(pki.LeafRequest{Identity: pki.ControllerIdentity, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := controllerLeaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	client, err := runner.Dial(ctx, o.listen, runner.ClientTLSConfig(pki.StaticCertificate(cert), pki.TrustFunc(authority.TrustPool), runnerID))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	readyCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := client.WaitReady(readyCtx); err != nil {
		t.Fatalf("runner not ready: %v", err)
	}
	resp, err := http.Get("http://" + o.healthListen + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz answered %v %v", resp, err)
	}
	_ = resp.Body.Close()

	data, digest, err := artifact.Build(map[string][]byte{"main.tf": []byte(`resource "terraform_data" "a" {}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Upload(readyCtx, digest, bytes.NewReader(data)); err != nil {
		t.Fatalf("upload failed: %v", err)
	}
	matches, _ := filepath.Glob(filepath.Join(workBase, "terrace-runner-*", "source", "main.tf"))
	if len(matches) != 1 {
		t.Fatalf("uploaded source not in a private work dir under %s: %v", workBase, matches)
	}

	stop() // what SIGTERM does through signal.NotifyContext
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runner ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("runner did not stop")
	}
	left, err := os.ReadDir(workBase)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("work dir not removed on shutdown: %v", left)
	}
}

// The runner collects its own heap less often, and only its own: tofu and
// the providers it starts inherit the environment, which must not gain a
// GOGC; a GOGC the pod sets wins.
func TestTheRunnersGCSettingIsItsOwn(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	for _, key := range []string{"GOGC", "GOMEMLIMIT"} {
		if v, set := os.LookupEnv(key); set {
			os.Unsetenv(key)
			t.Cleanup(func() { os.Setenv(key, v) })
		}
	}

	tuneGC()
	if got := debug.SetGCPercent(100); got != runnerGCPercent {
		t.Errorf("GC percent after tuneGC = %d, want %d", got, runnerGCPercent)
	}
	if got := debug.SetMemoryLimit(-1); got != runnerSoftMemoryLimit {
		t.Errorf("soft memory limit after tuneGC = %d, want %d", got, runnerSoftMemoryLimit)
	}
	for _, key := range []string{"GOGC", "GOMEMLIMIT"} {
		if v, set := os.LookupEnv(key); set {
			t.Errorf("tuneGC set %s=%s in the environment tofu inherits", key, v)
		}
	}

	t.Setenv("GOGC", "50")
	debug.SetGCPercent(50)
	tuneGC()
	if got := debug.SetGCPercent(100); got != 50 {
		t.Errorf("GC percent with GOGC=50 in the environment = %d, want 50", got)
	}
}
