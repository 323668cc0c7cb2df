package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// recordReleases writes deployed releases of a Stack through the release store.
func recordReleases(t *testing.T, ns, stack string, outputs []release.Output, sourceRevisions ...string) {
	t.Helper()
	env, _ := apiServer(t)
	h := release.History{Store: secrets.New(env.Client, secrets.Options{})}
	start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for i, rev := range sourceRevisions {
		_, err := h.Record(context.Background(), release.Release{
			Namespace: ns, Stack: stack, Status: release.StatusDeployed, SourceRevision: rev,
			PlanID: "plan-x", Plan: release.PlanSummary{Add: i + 1, Change: 1}, Outputs: outputs,
			StartedAt: start.Add(time.Duration(i) * time.Hour), FinishedAt: start.Add(time.Duration(i)*time.Hour + 42*time.Second),
			ToolVersion: "OpenTofu v1.12.6",
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

var webOutputs = []release.Output{
	{Name: "url", Value: json.RawMessage(`"https://web.example"`)},
	{Name: "ports", Value: json.RawMessage(`[80,443]`)},
	{Name: "password", Sensitive: true, Value: json.RawMessage(`"hunter2"`)},
}

func TestOutputsReadsTheOutputsSecretAndMasksSensitiveValues(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", func(s *terracev1.StackSpec) {
		s.WriteOutputsToSecret = &terracev1.OutputsSecret{Name: "web-outputs"}
	}, readyAt(1))
	recordReleases(t, ns, "web", webOutputs, "main@sha1:abc")
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-outputs"},
		Data: map[string][]byte{
			"url": []byte("https://web.example"), "ports": []byte("[80,443]"), "password": []byte("hunter2"),
			// Not in the release: its sensitivity is unknown, so it is masked.
			"token": []byte("s3cr3t"),
		},
	}
	if err := env.Client.Create(context.Background(), secret); err != nil {
		t.Fatal(err)
	}

	out, _, err := verb(t, "outputs", "web", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	want := "password=<sensitive>\nports=[80,443]\ntoken=<sensitive>\nurl=https://web.example\n"
	if out != want {
		t.Fatalf("outputs:\n%s\nwant:\n%s", out, want)
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "s3cr3t") {
		t.Fatal("a sensitive value was printed")
	}

	out, _, err = verb(t, "outputs", "web", "-n", ns, "--show-sensitive")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "outputs --show-sensitive", out, "password=hunter2", "token=s3cr3t")

	out, _, err = verb(t, "outputs", "web", "-n", ns, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var shown []stackview.Output
	if err := json.Unmarshal([]byte(out), &shown); err != nil || len(shown) != 4 {
		t.Fatalf("outputs -o json: %v\n%s", err, out)
	}
	if shown[0].Name != "password" || !shown[0].Masked || shown[0].Value != nil || *shown[3].Value != "https://web.example" {
		t.Fatalf("outputs -o json: %s", out)
	}
}

func TestOutputsWithoutASecret(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, func(st *terracev1.StackStatus) {
		readyAt(1)(st)
		st.Outputs = []string{"password", "ports", "url"}
	})
	recordReleases(t, ns, "web", webOutputs, "main@sha1:abc")
	newStack(t, ns, "pending", func(s *terracev1.StackSpec) {
		s.WriteOutputsToSecret = &terracev1.OutputsSecret{Name: "pending-outputs"}
	}, awaiting("plan-1-aaa"))

	out, errOut, err := verb(t, "outputs", "web", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	if out != "password=<sensitive>\nports=[80,443]\nurl=https://web.example\n" {
		t.Fatalf("outputs from the release:\n%s", out)
	}
	mustContain(t, "note", errOut, "has no outputs Secret", "set spec.writeOutputsToSecret", "from release 1")

	_, _, err = verb(t, "outputs", "pending", "-n", ns)
	mustFail(t, err, "writes its outputs to Secret pending-outputs, which does not exist yet")
}

func TestHistoryListsTheReleaseRecords(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, readyAt(2))
	newStack(t, ns, "new", nil, nil)
	recordReleases(t, ns, "web", webOutputs, "main@sha1:aaa", "main@sha1:bbb")

	out, _, err := verb(t, "history", "web", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", out)
	}
	mustContain(t, "header", lines[0], "REVISION", "STATUS", "SOURCE REVISION", "PLAN", "STARTED", "FINISHED", "TOOL VERSION")
	mustContain(t, "revision 1", lines[1], "1", "superseded", "main@sha1:aaa", "+1 ~1 -0", "2026-03-01T10:00:00Z", "2026-03-01T10:00:42Z", "OpenTofu v1.12.6")
	mustContain(t, "revision 2", lines[2], "2", "deployed", "main@sha1:bbb", "+2 ~1 -0", "2026-03-01T11:00:00Z")

	out, _, err = verb(t, "history", "web", "-n", ns, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var releases []release.Release
	if err := json.Unmarshal([]byte(out), &releases); err != nil || len(releases) != 2 || releases[1].Status != release.StatusDeployed {
		t.Fatalf("history -o json: %v\n%s", err, out)
	}
	if strings.Contains(out, "hunter2") {
		t.Fatal("a sensitive output value is in the history")
	}

	out, errOut, err := verb(t, "history", "new", "-n", ns)
	if err != nil || out != "" || !strings.Contains(errOut, "has no releases yet") {
		t.Fatalf("history of a new Stack: %v %q %q", err, out, errOut)
	}
	_, _, err = verb(t, "history", "gone", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/gone not found in namespace "+ns)
}
