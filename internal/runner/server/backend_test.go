package server

import (
	"archive/zip"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// memoryBackend is the smallest Terraform http backend: one state, one
// lock, and the identity of every client that touched it.
type memoryBackend struct {
	mu      sync.Mutex
	state   []byte
	lock    []byte
	callers map[pki.Identity]bool
}

func (b *memoryBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, err := pki.IdentityFromRequest(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.callers[id] = true
	switch r.Method {
	case http.MethodGet:
		if b.state == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_, _ = w.Write(b.state)
	case http.MethodPost:
		b.state = body
	case http.MethodDelete:
		b.state = nil
	case "LOCK":
		if b.lock != nil {
			w.WriteHeader(http.StatusLocked)
			_, _ = w.Write(b.lock)
			return
		}
		b.lock = body
	case "UNLOCK":
		b.lock = nil
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func TestHTTPBackendUsesTheRunnerCertificateWithoutStoringIt(t *testing.T) {
	tr := startRunner(t, nil)
	backend := &memoryBackend{callers: map[pki.Identity]bool{}}
	url := serveTLS(t, backend, pki.ServerTLSConfig(certSource(t, issue(t, tr.authority, pki.ControllerIdentity)), pki.TrustFunc(tr.authority.TrustPool), nil))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": "resource \"terraform_data\" \"a\" {\n  input = \"kept-in-the-backend\"\n}\n"})
	address := url + "/state/team-a/web/default"
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{Workspace: "default", HttpBackend: &runnerv1.HTTPBackend{
		Address: address, LockAddress: address, UnlockAddress: address,
	}}, nil); err != nil {
		t.Fatalf("init with the http backend failed: %v", err)
	}
	plan, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{}, nil)
	if err != nil {
		t.Fatalf("plan failed: %v", err)
	}
	if err := tr.client.Apply(ctx, plan.GetPlanId(), nil); err != nil {
		t.Fatalf("apply failed: %v", err)
	}
	backend.mu.Lock()
	state, lock, callers := string(backend.state), backend.lock, backend.callers
	backend.mu.Unlock()
	if !strings.Contains(state, "kept-in-the-backend") || lock != nil || !callers[testRunnerIdentity] || len(callers) != 1 {
		t.Fatalf("backend after apply: state has value=%v, lock=%s, callers=%v", strings.Contains(state, "kept-in-the-backend"), lock, callers)
	}

	// A lock left by a dead run blocks the next plan until it is force-unlocked.
	backend.mu.Lock()
	backend.lock = []byte(`{"ID":"dead-run-lock","Operation":"OperationTypeApply","Who":"run-0"}`)
	backend.mu.Unlock()
	if _, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{}, nil); runner.Reason(err) != runner.ReasonStateLocked || !strings.Contains(err.Error(), "dead-run-lock") {
		t.Fatalf("plan against a held lock answered %v, want a STATE_LOCKED failure naming the lock", err)
	}
	if err := tr.client.ForceUnlock(ctx, "dead-run-lock"); err != nil {
		t.Fatalf("force-unlock failed: %v", err)
	}
	backend.mu.Lock()
	lock = backend.lock
	backend.mu.Unlock()
	if lock != nil {
		t.Fatalf("lock still held after force-unlock: %s", lock)
	}
	if _, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{PlanId: "after-unlock"}, nil); err != nil {
		t.Fatalf("plan after force-unlock failed: %v", err)
	}

	var planFile bytes.Buffer
	if _, err := tr.client.DownloadPlan(ctx, plan.GetPlanId(), &planFile); err != nil {
		t.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(planFile.Bytes()), int64(planFile.Len()))
	if err != nil {
		t.Fatalf("plan file is not a zip: %v", err)
	}
	var contents bytes.Buffer
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(&contents, rc)
		_ = rc.Close()
	}
	if !bytes.Contains(contents.Bytes(), []byte("http")) {
		t.Fatalf("the plan file does not record the http backend; the check below would prove nothing")
	}
	for _, leak := range []string{"PRIVATE KEY", "BEGIN CERTIFICATE"} {
		if bytes.Contains(contents.Bytes(), []byte(leak)) {
			t.Errorf("the plan file holds %q", leak)
		}
	}
	backendState, err := os.ReadFile(filepath.Join(tr.workDir, "source", ".terraform", "terraform.tfstate"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(backendState, []byte("PRIVATE KEY")) || !bytes.Contains(backendState, []byte(`"http"`)) {
		t.Errorf(".terraform/terraform.tfstate holds the key or lacks the backend:\n%s", backendState)
	}
}
