package program

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/readiness"
)

const waitTimeout = 30 * time.Second

func files(kv ...string) map[string]terracev1.ProgramFile {
	m := map[string]terracev1.ProgramFile{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = terracev1.ProgramFile(kv[i+1])
	}
	return m
}

func createProgram(t *testing.T, namespace, name string, f map[string]terracev1.ProgramFile) *terracev1.Program {
	t.Helper()
	p := &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: terracev1.ProgramSpec{Files: f}}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatalf("failed to create program: %v", err)
	}
	return p
}

// waitForProgram polls until cond holds for the Program's latest state and
// returns that state.
func waitForProgram(t *testing.T, key client.ObjectKey, what string, cond func(p *terracev1.Program) bool) *terracev1.Program {
	t.Helper()
	var last *terracev1.Program
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		p := &terracev1.Program{}
		if err := env.Client.Get(ctx, key, p); err != nil {
			return false, err
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("program %s never became %s: %v; last status: %+v", key, what, err, last.Status)
	}
	return last
}

func readyAtGeneration(p *terracev1.Program) bool {
	ready, _, _ := readiness.ReadyAtGeneration(p)
	return ready && p.Status.Artifact != nil
}

func stalledAtGeneration(p *terracev1.Program) bool {
	return p.Status.ObservedGeneration == p.Generation && outcome.IsTrue(p, terracev1.StalledCondition)
}

func fetch(t *testing.T, id pki.Identity, url string) (int, []byte) {
	t.Helper()
	resp, err := httpClient(t, id).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, buf.Bytes()
}

func sha256Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func eventReasons(t *testing.T, p *terracev1.Program) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(p.Namespace)); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.Name == p.Name && e.Regarding.Kind == "Program" {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

func waitForEvent(t *testing.T, p *terracev1.Program, reason string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
		for _, r := range eventReasons(t, p) {
			if r == reason {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event for %s; events: %v", reason, p.Name, eventReasons(t, p))
	}
}

func TestProgramServesItsArtifactAndMovesWithEdits(t *testing.T) {
	ns := env.Namespace(t)
	p := createProgram(t, ns, "web", files(
		"main.tf", "module \"x\" {\n  source = \"./modules/x\"\n}\n",
		"modules/x/main.tf", "output \"greeting\" {\n  value = \"hello\"\n}\n",
		"templates/motd.tpl", "hello ${name} {{ not hcl",
	))
	key := client.ObjectKeyFromObject(p)
	got := waitForProgram(t, key, "Ready", readyAtGeneration)
	if ready, why, err := readiness.ReadyAtGeneration(got); err != nil || !ready {
		t.Fatalf("not Ready at its generation as kstatus reads it: %s %v", why, err)
	}
	a := got.Status.Artifact
	ready := outcome.Get(got, terracev1.ReadyCondition)
	if ready.Reason != terracev1.ArtifactReadyReason || a.URL != baseURL+"/programs/"+ns+"/web/1.tar.gz" || a.Revision != "1@"+a.Digest {
		t.Fatalf("status: %+v, artifact %+v", ready, a)
	}

	code, data := fetch(t, pki.RunnerIdentity(ns, "stack", "run-1"), a.URL)
	if code != http.StatusOK || sha256Digest(data) != a.Digest || int64(len(data)) != *a.Size {
		t.Fatalf("fetch: %d, digest %s, want %s (size %d/%d)", code, sha256Digest(data), a.Digest, len(data), *a.Size)
	}
	dest := filepath.Join(t.TempDir(), "src")
	if err := artifact.ExtractBytes(data, a.Digest, dest, artifact.Limits{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "modules", "x", "main.tf")); err != nil || !strings.Contains(string(b), "hello") {
		t.Fatalf("modules/x/main.tf: %q %v", b, err)
	}
	waitForEvent(t, got, NewArtifactReason)

	// Edit: the generation moves, the old URL is gone, the new one serves the new content.
	got.Spec.Files["modules/x/main.tf"] = "output \"greeting\" {\n  value = \"bonjour\"\n}\n"
	if err := env.Client.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	edited := waitForProgram(t, key, "Ready at generation 2", func(p *terracev1.Program) bool {
		return p.Generation == 2 && readyAtGeneration(p)
	})
	b := edited.Status.Artifact
	if b.URL != baseURL+"/programs/"+ns+"/web/2.tar.gz" || b.Digest == a.Digest || !b.LastUpdateTime.After(a.LastUpdateTime.Add(-time.Second)) {
		t.Fatalf("artifact after edit: %+v (before: %+v)", b, a)
	}
	if code, body := fetch(t, pki.RunnerIdentity(ns, "stack", "run-2"), a.URL); code != http.StatusGone {
		t.Fatalf("old URL answered %d %q, want 410", code, body)
	}
	code, data = fetch(t, pki.RunnerIdentity(ns, "stack", "run-2"), b.URL)
	if code != http.StatusOK || sha256Digest(data) != b.Digest {
		t.Fatalf("new URL: %d, digest %s, want %s", code, sha256Digest(data), b.Digest)
	}
	dest2 := filepath.Join(t.TempDir(), "src")
	if err := artifact.ExtractBytes(data, b.Digest, dest2, artifact.Limits{}); err != nil {
		t.Fatal(err)
	}
	if content, _ := os.ReadFile(filepath.Join(dest2, "modules", "x", "main.tf")); !strings.Contains(string(content), "bonjour") {
		t.Fatalf("new content not served: %q", content)
	}
	if code, _ := fetch(t, pki.RunnerIdentity(ns, "stack", "run-2"), baseURL+"/programs/"+ns+"/web/3.tar.gz"); code != http.StatusNotFound {
		t.Fatalf("future generation answered %d, want 404", code)
	}
	if code, _ := fetch(t, pki.ControllerIdentity, b.URL); code != http.StatusOK {
		t.Fatalf("controller identity answered %d", code)
	}

	// Building the same Program again gives identical bytes.
	rebuilt, digest, err := artifactserver.BuildProgram(edited)
	if err != nil || !bytes.Equal(rebuilt, data) || digest != b.Digest {
		t.Fatalf("a second build differs from the served bytes (%v)", err)
	}
}

func TestArtifactAccessIsLimitedToTheNamespace(t *testing.T) {
	ns := env.Namespace(t)
	other := env.Namespace(t)
	p := createProgram(t, ns, "private", files("main.tf", "locals {}\n"))
	got := waitForProgram(t, client.ObjectKeyFromObject(p), "Ready", readyAtGeneration)

	code, body := fetch(t, pki.RunnerIdentity(other, "stack", "run-1"), got.Status.Artifact.URL)
	if code != http.StatusForbidden || !strings.Contains(string(body), "may not read programs of namespace "+ns) {
		t.Fatalf("runner of another namespace: %d %q, want 403", code, body)
	}
	_, err := httpClient(t, "").Get(got.Status.Artifact.URL)
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if !strings.Contains(err.Error(), "certificate required") && !strings.Contains(err.Error(), "bad certificate") {
		t.Fatalf("a client without a certificate was not refused at the handshake: %v", err)
	}
}

func TestInvalidProgramStallsAndRecovers(t *testing.T) {
	ns := env.Namespace(t)
	p := createProgram(t, ns, "broken", files(
		"main.tf", "module \"x\" {\n  source = \"./modules/x\"\n}\n",
		"modules/x/main.tf", "locals {\n  a = 1\n  b = = 2\n}\n",
	))
	key := client.ObjectKeyFromObject(p)
	got := waitForProgram(t, key, "Stalled", stalledAtGeneration)
	ready := outcome.Get(got, terracev1.ReadyCondition)
	if ready.Status != metav1.ConditionFalse || ready.Reason != terracev1.InvalidProgramReason || !strings.HasPrefix(ready.Message, "modules/x/main.tf:3:") {
		t.Fatalf("Ready: %+v", ready)
	}
	t.Logf("invalid program message: %s", ready.Message)
	if got.Status.Artifact != nil || outcome.IsTrue(got, terracev1.ReconcilingCondition) {
		t.Fatalf("an invalid program advertises an artifact or is still Reconciling: %+v", got.Status)
	}
	invalidURL := artifactserver.ProgramURL(baseURL, ns, "broken", got.Generation)
	if code, body := fetch(t, pki.RunnerIdentity(ns, "s", "r"), invalidURL); code != http.StatusConflict || !strings.Contains(string(body), "modules/x/main.tf:3:") {
		t.Fatalf("invalid generation served: %d %q", code, body)
	}

	got.Spec.Files["modules/x/main.tf"] = "locals {\n  a = 1\n  b = 2\n}\n"
	if err := env.Client.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	fixed := waitForProgram(t, key, "Ready after the fix", readyAtGeneration)
	if ready, why, err := readiness.ReadyAtGeneration(fixed); err != nil || !ready {
		t.Fatalf("not Ready at its generation as kstatus reads it: %s %v", why, err)
	}
	if outcome.Get(fixed, terracev1.StalledCondition) != nil {
		t.Fatal("Stalled survived the fix")
	}
	waitForEvent(t, fixed, RecoveredReason)
	for _, r := range eventReasons(t, fixed) {
		if r != RecoveredReason && r != NewArtifactReason {
			t.Fatalf("unexpected event %s", r)
		}
	}
}

func TestOversizeProgramIsInvalid(t *testing.T) {
	ns := env.Namespace(t)
	big := strings.Repeat("# padding\n", 30*1024) // ~300 KiB each, ~600 KiB together
	p := createProgram(t, ns, "huge", files("a.tf", big, "b.tf", big))
	got := waitForProgram(t, client.ObjectKeyFromObject(p), "Stalled", stalledAtGeneration)
	if msg := outcome.Get(got, terracev1.ReadyCondition).Message; !strings.Contains(msg, "more than the 524288 allowed") {
		t.Fatalf("Ready message: %s", msg)
	}
}

// TestNestingBombProgramsStallAndTheControllerStaysUp: the nesting bombs
// of TestValidateFilesSurvivesNestingBombs, through the real reconciler:
// each Program stalls as InvalidProgram naming file:line:col, advertises no
// artifact, and a Program created after them still goes Ready (before the
// nesting check the first reconcile overflowed the stack and ended this
// process, as it ended the controller).
func TestNestingBombProgramsStallAndTheControllerStaysUp(t *testing.T) {
	ns := env.Namespace(t)
	for name, tc := range map[string]struct{ file, content, want string }{
		"hcl-bomb":  {"main.tf", "a = " + strings.Repeat("[", 60000), "main.tf:1:261: Nesting too deep: nesting deeper than 256 levels"},
		"json-bomb": {"main.tf.json", strings.Repeat("[", 500000), "main.tf.json:1:257: Nesting too deep: nesting deeper than 256 levels"},
	} {
		p := createProgram(t, ns, name, files(tc.file, tc.content))
		got := waitForProgram(t, client.ObjectKeyFromObject(p), "Stalled", stalledAtGeneration)
		ready := outcome.Get(got, terracev1.ReadyCondition)
		if ready.Status != metav1.ConditionFalse || ready.Reason != terracev1.InvalidProgramReason || !strings.HasPrefix(ready.Message, tc.want) {
			t.Fatalf("%s: Ready %+v", name, ready)
		}
		if got.Status.Artifact != nil {
			t.Fatalf("%s: an artifact is advertised: %+v", name, got.Status.Artifact)
		}
	}
	p := createProgram(t, ns, "after", files("main.tf", "output \"x\" { value = [[1]] }\n"))
	waitForProgram(t, client.ObjectKeyFromObject(p), "Ready", readyAtGeneration)
}

func TestSameFilesGiveTheSameDigestAcrossNamespaces(t *testing.T) {
	f := files("main.tf", "output \"x\" { value = 1 }\n", "modules/a/b.tf.json", `{"locals": {"c": 1}}`)
	var digests []string
	for range 2 {
		ns := env.Namespace(t)
		p := createProgram(t, ns, "same", f)
		got := waitForProgram(t, client.ObjectKeyFromObject(p), "Ready", readyAtGeneration)
		code, data := fetch(t, pki.RunnerIdentity(ns, "s", "r"), got.Status.Artifact.URL)
		if code != http.StatusOK || sha256Digest(data) != got.Status.Artifact.Digest {
			t.Fatalf("fetch in %s: %d", ns, code)
		}
		digests = append(digests, got.Status.Artifact.Digest)
	}
	if digests[0] != digests[1] {
		t.Fatalf("same files, different digests: %v", digests)
	}
}

func TestInvalidJSONNamesTheFile(t *testing.T) {
	ns := env.Namespace(t)
	p := createProgram(t, ns, "json", files("main.tf", "locals {}\n", "extra.tf.json", "{\n  \"locals\": {\n    \"a\": \n}\n"))
	got := waitForProgram(t, client.ObjectKeyFromObject(p), "Stalled", stalledAtGeneration)
	if msg := outcome.Get(got, terracev1.ReadyCondition).Message; !strings.HasPrefix(msg, "extra.tf.json:4:") {
		t.Fatalf("Ready message: %s", msg)
	}
}

func TestReconcileRequestIsHandled(t *testing.T) {
	ns := env.Namespace(t)
	p := createProgram(t, ns, "poked", files("main.tf", "locals {}\n"))
	key := client.ObjectKeyFromObject(p)
	got := waitForProgram(t, key, "Ready", readyAtGeneration)
	patch := client.MergeFrom(got.DeepCopy())
	got.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "2026-11-30T07:00:00Z"}
	if err := env.Client.Patch(context.Background(), got, patch); err != nil {
		t.Fatal(err)
	}
	waitForProgram(t, key, "handled", func(p *terracev1.Program) bool {
		return p.Status.LastHandledReconcileAt == "2026-11-30T07:00:00Z"
	})
}

// A runner holding a stale status gets a FetchStatusError with 410 and
// knows to read status.artifact again.
func TestFetchReportsGoneForASupersededGeneration(t *testing.T) {
	ns := env.Namespace(t)
	p := createProgram(t, ns, "moving", files("main.tf", "locals { v = 1 }\n"))
	key := client.ObjectKeyFromObject(p)
	first := waitForProgram(t, key, "Ready", readyAtGeneration)
	first.Spec.Files["main.tf"] = "locals { v = 2 }\n"
	if err := env.Client.Update(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitForProgram(t, key, "Ready at generation 2", func(p *terracev1.Program) bool { return p.Generation == 2 && readyAtGeneration(p) })
	_, err := artifact.Fetch(context.Background(), httpClient(t, pki.RunnerIdentity(ns, "s", "r")), first.Status.Artifact.URL, first.Status.Artifact.Digest, 1<<20)
	var status *artifact.FetchStatusError
	if !errors.As(err, &status) || status.StatusCode != http.StatusGone {
		t.Fatalf("want 410 Gone, got %v", err)
	}
}
