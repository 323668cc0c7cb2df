package httpbackend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/testenv"
)

const tofuModule = `
variable "n" {
  type = number
}

resource "terraform_data" "r" {
  input = var.n
}

output "n" {
  value = terraform_data.r.output
}
`

// tofuRunner runs the real tofu binary in a module directory, offline.
type tofuRunner struct {
	bin string
	dir string
	env []string
}

func newTofuRunner(t *testing.T, backend map[string]any) *tofuRunner {
	t.Helper()
	bin := testenv.RequireTofu(t)
	dir := t.TempDir()
	cfg, err := json.MarshalIndent(map[string]any{"terraform": map[string]any{"backend": map[string]any{"http": backend}}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"main.tf": []byte(tofuModule), "backend.tf.json": cfg, "cli.tfrc": nil} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1", "TF_INPUT=0", "TF_CLI_CONFIG_FILE=" + filepath.Join(dir, "cli.tfrc")}
	return &tofuRunner{bin: bin, dir: dir, env: env}
}

func (r *tofuRunner) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, append(args, "-no-color")...)
	if args[0] == "force-unlock" || (args[0] == "state" && args[1] == "pull") {
		cmd = exec.CommandContext(ctx, r.bin, args...)
	}
	cmd.Dir, cmd.Env = r.dir, r.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

func (r *tofuRunner) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := r.run(t, args...)
	if err != nil {
		t.Fatalf("tofu %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// Real tofu with `backend "http"` and a runner's client certificate: init,
// apply, a second apply and state pull round-trip through the server; a
// second operation is refused with the lock holder's info.
func TestTofuHTTPBackend(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	ns, stack := uniqueName("tofu-"), "web"
	key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
	f.runs.startRun(t, ns, stack, "run-7")
	leaf := f.leaf(t, pki.RunnerIdentity(ns, stack, "run-7"))
	address := httpbackend.Address(f.baseURL, key)
	tofu := newTofuRunner(t, map[string]any{
		"address":                   address,
		"lock_address":              address,
		"unlock_address":            address,
		"client_certificate_pem":    string(leaf.CertPEM),
		"client_private_key_pem":    string(leaf.KeyPEM),
		"client_ca_certificate_pem": string(leaf.CABundlePEM),
		"retry_max":                 0,
	})

	tofu.mustRun(t, "init", "-input=false")
	tofu.mustRun(t, "apply", "-auto-approve", "-input=false", "-var", "n=1")
	first, err := f.store.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("state after the first apply: %v", err)
	}
	tofu.mustRun(t, "apply", "-auto-approve", "-input=false", "-var", "n=2")
	second, err := f.store.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if second.Serial <= first.Serial || second.Lineage != first.Lineage || second.Lineage == "" {
		t.Fatalf("second apply stored serial %d lineage %q after serial %d lineage %q", second.Serial, second.Lineage, first.Serial, first.Lineage)
	}
	var doc struct {
		Outputs map[string]struct {
			Value float64 `json:"value"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(second.Data, &doc); err != nil || doc.Outputs["n"].Value != 2 {
		t.Fatalf("stored state has outputs %+v (%v), want n = 2", doc.Outputs, err)
	}
	if lock, err := f.store.GetLock(t.Context(), key); err != nil || lock != nil {
		t.Fatalf("apply left the lock held: %+v, %v", lock, err)
	}
	pulled := tofu.mustRun(t, "state", "pull")
	if !bytes.Equal(bytes.TrimSpace([]byte(pulled)), bytes.TrimSpace(second.Data)) {
		t.Fatalf("tofu state pull differs from the stored state:\n%s\n---\n%s", pulled, second.Data)
	}
	if out := tofu.mustRun(t, "plan", "-input=false", "-var", "n=2", "-detailed-exitcode"); !strings.Contains(out, "No changes") {
		t.Fatalf("plan after apply is not empty:\n%s", out)
	}

	// Someone else holds the lock: tofu is refused and is not told who.
	holder := state.LockInfo{ID: "5d5d0f3c-held-by-test", Operation: "OperationTypeApply", Who: "runner@stack-web-run-6", Version: "1.12.6", Created: time.Now().UTC()}
	if err := f.store.Lock(t.Context(), key, holder); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := tofu.run(t, "plan", "-input=false", "-var", "n=3", "-lock-timeout=0s")
	if err == nil {
		t.Fatal("tofu plan ran while another holder had the lock")
	}
	t.Logf("tofu plan refused while locked:\n%s", errOut)
	if !strings.Contains(errOut, "Error acquiring the state lock") || !strings.Contains(errOut, "held-by-another-run") {
		t.Fatalf("tofu's refusal does not say the state is locked by another run:\n%s", errOut)
	}
	for _, secret := range []string{holder.ID, holder.Who} {
		if strings.Contains(errOut, secret) {
			t.Fatalf("tofu's refusal discloses the holder's %q:\n%s", secret, errOut)
		}
	}
	_, _, err = tofu.run(t, "apply", "-auto-approve", "-input=false", "-var", "n=3", "-lock-timeout=0s")
	if err == nil {
		t.Fatal("tofu apply ran while another holder had the lock")
	}
	if cur, err := f.store.Get(t.Context(), key); err != nil || cur.Version != second.Version {
		t.Fatalf("state changed while locked: %+v %v", cur, err)
	}
	// Even knowing the holder's ID, the runner may not release a lock it
	// did not take; the controller releases the locks of runs that are gone.
	if _, errOut, err := tofu.run(t, "force-unlock", "-force", holder.ID); err == nil {
		t.Fatalf("a runner force-unlocked another holder's lock:\n%s", errOut)
	}
	if lock, err := f.store.GetLock(t.Context(), key); err != nil || lock == nil || lock.ID != holder.ID {
		t.Fatalf("lock after a runner's force-unlock: %+v, %v; want it still held", lock, err)
	}
	if err := f.store.ForceUnlock(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	tofu.mustRun(t, "apply", "-auto-approve", "-input=false", "-var", "n=3")
	versions, err := f.store.ListVersions(t.Context(), key)
	if err != nil || len(versions) < 3 {
		t.Fatalf("history after three applies: %d versions, %v", len(versions), err)
	}
}

// Two real tofu processes at once (of one run: only one run of a Stack is
// current): while one apply holds the lock, the other is refused.
func TestTofuConcurrentOperationsRefused(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	ns, stack := uniqueName("tofu-"), "api"
	key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
	address := httpbackend.Address(f.baseURL, key)
	runID := uniqueName("run-")
	f.runs.startRun(t, ns, stack, runID)
	backend := func() map[string]any {
		leaf := f.leaf(t, pki.RunnerIdentity(ns, stack, runID))
		return map[string]any{
			"address": address, "lock_address": address, "unlock_address": address,
			"client_certificate_pem": string(leaf.CertPEM), "client_private_key_pem": string(leaf.KeyPEM), "client_ca_certificate_pem": string(leaf.CABundlePEM),
		}
	}
	first, second := newTofuRunner(t, backend()), newTofuRunner(t, backend())
	first.mustRun(t, "init", "-input=false")
	second.mustRun(t, "init", "-input=false")
	first.mustRun(t, "apply", "-auto-approve", "-input=false", "-var", "n=1")

	// The first tofu waits at the approval prompt of an apply, holding the
	// lock, until its stdin is closed.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, first.bin, "apply", "-no-color", "-var", "n=2")
	cmd.Dir = first.dir
	cmd.Env = append(first.env[:len(first.env):len(first.env)], "TF_INPUT=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var held *state.LockInfo
	deadline := time.Now().Add(time.Minute)
	for held == nil && time.Now().Before(deadline) {
		if held, err = f.store.GetLock(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		if held == nil {
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
	if held == nil {
		t.Fatalf("the first tofu never took the lock:\n%s", out.String())
	}
	_, errOut, err := second.run(t, "plan", "-input=false", "-var", "n=3", "-lock-timeout=0s")
	if err == nil {
		t.Fatal("a second tofu plan ran while the first apply held the lock")
	}
	if !strings.Contains(errOut, "held-by-another-run") || strings.Contains(errOut, held.ID) {
		t.Fatalf("the refusal does not say the state is locked, or names the holder's lock %s:\n%s", held.ID, errOut)
	}
	_, _ = stdin.Write([]byte("no\n"))
	_ = stdin.Close()
	_ = cmd.Wait() // "no" cancels the apply: a non-zero exit is expected
	if lock, err := f.store.GetLock(t.Context(), key); err != nil || lock != nil {
		t.Fatalf("the cancelled apply left its lock: %+v %v\n%s", lock, err, out.String())
	}
	second.mustRun(t, "plan", "-input=false", "-var", "n=3", "-lock-timeout=0s")
}
