package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"code.gitea.io/sdk/gitea"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestGiteaRunsInTheDevCluster checks the Gitea the Git loop's tests use
// (startGitea): built from its Go module, it runs in the dev cluster on
// PostgreSQL; a commit pushed over HTTP from this process reaches its
// branch, Gitea delivers the push's webhook, signed, to a server on the
// host's end of the link, the helpers' pull request, comment and commit
// status calls work, and a pod clones the repository through the
// Service's DNS name with git.
func TestGiteaRunsInTheDevCluster(t *testing.T) {
	ctx := context.Background()
	g := startGitea(ctx, t)
	cs := kubernetes.NewForConfigOrDie(sharedDev(t).Cluster.Config)
	defer logPodsOnFailure(t, cs, giteaNamespace)
	begin := time.Now()

	if v, _, err := g.API.ServerVersion(); err != nil || v != "1.26.0" {
		t.Fatalf("gitea's version is %q (%v), want 1.26.0", v, err)
	}

	type delivery struct{ event, signature, body string }
	deliveries := make(chan delivery, 8)
	hooks := newLinkServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		deliveries <- delivery{r.Header.Get("X-Gitea-Event"), r.Header.Get("X-Gitea-Signature"), string(body)}
	}))
	secret := randomHex(16)

	repo := g.createRepo(t, "smoke-"+randomHex(3))
	repo.addWebhook(t, hooks.URL, secret, "push")
	module := `output "greeting" { value = "hello" }` + "\n"
	first := repo.push(t, "main", map[string]string{"main.tf": module, "modules/net/main.tf": "# net\n"}, "first commit")
	branch, _, err := g.API.GetRepoBranch(repo.Owner, repo.Name, "main")
	if err != nil {
		t.Fatalf("the pushed branch main: %v", err)
	}
	if branch.Commit.ID != first {
		t.Fatalf("main is at %s, want the pushed %s", branch.Commit.ID, first)
	}
	t.Logf("pushed %s to %s after %s", first, repo.CloneURL, time.Since(begin).Round(100*time.Millisecond))

	select {
	case d := <-deliveries:
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(d.body))
		if d.event != "push" || d.signature != hex.EncodeToString(mac.Sum(nil)) {
			t.Fatalf("the webhook's call: event %q, signature %q, want push signed with the secret", d.event, d.signature)
		}
		var push struct {
			Ref, After string
		}
		if err := json.Unmarshal([]byte(d.body), &push); err != nil || push.Ref != "refs/heads/main" || push.After != first {
			t.Fatalf("the push webhook's payload: %+v (%v), want refs/heads/main at %s", push, err, first)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("gitea delivered no push webhook to the link in 30 s")
	}

	second := repo.push(t, "change", map[string]string{"main.tf": module + `output "more" { value = 2 }` + "\n", "modules/net/main.tf": ""}, "second commit")
	pr := repo.openPullRequest(t, "change", "main", "Change the greeting")
	if pr.Head == nil || pr.Head.Sha != second {
		t.Fatalf("the pull request's head is %+v, want %s", pr.Head, second)
	}
	repo.comment(t, pr.Index, "/terrace plan")
	comments, err := repo.comments(pr.Index)
	if err != nil || len(comments) != 1 || comments[0].Body != "/terrace plan" {
		t.Fatalf("the pull request's comments: %v (%v), want the one added", comments, err)
	}
	if _, _, err := g.API.CreateStatus(repo.Owner, repo.Name, second, gitea.CreateStatusOption{
		State: gitea.StatusSuccess, Context: "terrace/e2e/smoke", Description: "+0 ~0 -0",
	}); err != nil {
		t.Fatal(err)
	}
	statuses, err := repo.statuses(second)
	if err != nil || !slices.ContainsFunc(statuses, func(s *gitea.Status) bool {
		return s.Context == "terrace/e2e/smoke" && s.State == gitea.StatusSuccess
	}) {
		t.Fatalf("the head commit's statuses: %v (%v), want terrace/e2e/smoke success", statuses, err)
	}

	// A pod clones the pull request's branch through the Service's DNS
	// name, as a runner would.
	ns := testNamespace(t, cs)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "clone"},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "git", Image: giteaImage, Command: []string{"/bin/sh", "-c",
					`git clone -q --depth 1 --branch change "$URL" /tmp/repo && git -C /tmp/repo rev-parse HEAD && ls /tmp/repo`},
				Env: []corev1.EnvVar{{Name: "URL", Value: repo.InClusterCloneURL}, {Name: "HOME", Value: "/tmp"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if !strings.HasPrefix(repo.InClusterCloneURL, giteaInClusterURL+"/") {
		t.Fatalf("the repository's clone URL is %s, want it under %s", repo.InClusterCloneURL, giteaInClusterURL)
	}
	phase, log := runPodToTheEnd(t, cs, pod, ns, time.Minute)
	if phase != corev1.PodSucceeded || !strings.Contains(log, second) || strings.Contains(log, "modules") {
		t.Fatalf("the clone from pod %s/clone ended %s, want %s without modules/: %s", ns, phase, second, log)
	}
	t.Logf("a pod cloned %s after %s", repo.InClusterCloneURL, time.Since(begin).Round(100*time.Millisecond))
}
