package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

const hookSecret = "s3cret"

func gitStack(ns, name, url, secret string, ref *terracev1.GitRef, prs bool) *terracev1.Stack {
	git := &terracev1.GitSource{URL: url, Ref: ref}
	if secret != "" {
		git.Webhook = &terracev1.GitWebhook{SecretRef: terracev1.LocalObjectReference{Name: secret}}
	}
	if prs {
		git.PullRequests = &terracev1.GitPullRequests{Enabled: true, Provider: terracev1.GitProviderGitHub, SecretRef: terracev1.LocalObjectReference{Name: "forge"}}
	}
	return &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: terracev1.StackSpec{Source: terracev1.StackSource{Git: git}}}
}

func secretOf(ns, name, token string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{SecretKey: []byte(token)}}
}

// world is a namespace with Stacks on the GitHub sample's repository and
// around it.
func world(t *testing.T) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := terracev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	main := &terracev1.GitRef{Branch: "main"}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		gitStack("team-a", "network", "https://github.com/Codertocat/Hello-World", "hook", nil, false),
		gitStack("team-a", "same-repo-ssh", "git@GitHub.com:codertocat/hello-world.git", "hook", main, true),
		gitStack("team-a", "other-branch", "https://github.com/Codertocat/Hello-World.git", "hook", &terracev1.GitRef{Branch: "release"}, false),
		gitStack("team-a", "tag-pinned", "https://github.com/Codertocat/Hello-World.git", "hook", &terracev1.GitRef{Tag: "v1.0.0"}, false),
		gitStack("team-a", "other-secret", "https://github.com/Codertocat/Hello-World.git", "other-hook", main, false),
		gitStack("team-a", "no-webhook", "https://github.com/Codertocat/Hello-World.git", "", main, false),
		gitStack("team-a", "other-repo", "https://github.com/Codertocat/Other.git", "hook", main, false),
		gitStack("team-b", "network", "https://github.com/Codertocat/Hello-World.git", "hook", main, false),
		gitStack("team-a", "gitea", "ssh://gitea@localhost:2222/gitea/webhooks.git", "hook", &terracev1.GitRef{Branch: "develop"}, false),
		gitStack("team-a", "gitlab", "http://example.com/mike/diaspora.git", "hook", &terracev1.GitRef{Branch: "master"}, false),
		secretOf("team-a", "hook", hookSecret+"\n"),
		secretOf("team-a", "other-hook", "another secret"),
		secretOf("team-b", "hook", hookSecret),
	).Build()
}

func sign(body []byte, secret string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

func post(t *testing.T, r *Receiver, ns string, h http.Header, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	mux := http.NewServeMux()
	r.Register(mux)
	req := httptest.NewRequest(http.MethodPost, "/hooks/"+ns, strings.NewReader(string(body)))
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	return w
}

// requested lists the Stacks of ns that carry terrace.dev/requestedAt.
func requested(t *testing.T, c client.Client, ns string) []string {
	t.Helper()
	var list terracev1.StackList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		v, ok := s.Annotations[terracev1.ReconcileRequestAnnotation]
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || time.Since(at) > time.Minute {
			t.Errorf("%s: requestedAt %q is not a recent RFC3339Nano time", s.Name, v)
		}
		out = append(out, s.Name)
	}
	return out
}

func TestPushReconcilesTheStacksThatFollowTheBranch(t *testing.T) {
	c := world(t)
	body := sample(t, "github-push.json")
	w := post(t, New(c, c, Options{}), "team-a", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+sign(body, hookSecret)), body)
	if w.Code != http.StatusAccepted || strings.TrimSpace(w.Body.String()) != `{"stacks":2}` {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	// network follows main by default; same-repo-ssh names the repository
	// in another form and case. Not: another branch, a tag, another
	// secret, no webhook, another repository, another namespace.
	if got := strings.Join(requested(t, c, "team-a"), ","); got != "network,same-repo-ssh" {
		t.Fatalf("annotated %s", got)
	}
	if got := requested(t, c, "team-b"); len(got) != 0 {
		t.Fatalf("another namespace annotated: %v", got)
	}
}

func TestPullRequestReconcilesTheStacksThatPlanPullRequests(t *testing.T) {
	c := world(t)
	body := sample(t, "github-pull-request.json")
	w := post(t, New(c, c, Options{}), "team-a", headers("X-GitHub-Event", "pull_request", "X-Hub-Signature-256", "sha256="+sign(body, hookSecret)), body)
	if w.Code != http.StatusAccepted {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got := strings.Join(requested(t, c, "team-a"), ","); got != "same-repo-ssh" {
		t.Fatalf("annotated %s", got)
	}
}

func TestGiteaAndGitLabPushes(t *testing.T) {
	c := world(t)
	body := sample(t, "gitea-push.json")
	if w := post(t, New(c, c, Options{}), "team-a", headers("X-Gitea-Event", "push", "X-Gitea-Signature", sign(body, hookSecret)), body); w.Code != http.StatusAccepted {
		t.Fatalf("gitea: %d %s", w.Code, w.Body)
	}
	body = sample(t, "gitlab-push.json")
	if w := post(t, New(c, c, Options{}), "team-a", headers("X-Gitlab-Event", "Push Hook", "X-Gitlab-Token", hookSecret), body); w.Code != http.StatusAccepted {
		t.Fatalf("gitlab: %d %s", w.Code, w.Body)
	}
	if got := strings.Join(requested(t, c, "team-a"), ","); got != "gitea,gitlab" {
		t.Fatalf("annotated %s", got)
	}
}

func TestRefusals(t *testing.T) {
	body := sample(t, "github-push.json")
	good := sign(body, hookSecret)
	for name, tc := range map[string]struct {
		ns     string
		h      http.Header
		body   []byte
		opts   Options
		status int
	}{
		"unsigned":                  {"team-a", headers("X-GitHub-Event", "push"), body, Options{}, 401},
		"wrongly signed":            {"team-a", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+sign(body, "guess")), body, Options{}, 401},
		"signed, body changed":      {"team-a", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+good), append([]byte(" "), body...), Options{}, 401},
		"no such Stack (namespace)": {"team-c", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+good), body, Options{}, 401},
		"gitlab, wrong token":       {"team-a", headers("X-Gitlab-Event", "Push Hook", "X-Gitlab-Token", "guess"), sample(t, "gitlab-push.json"), Options{}, 401},
		"unknown event":             {"team-a", headers("X-GitHub-Event", "star", "X-Hub-Signature-256", "sha256="+good), body, Options{}, 400},
		"unknown forge":             {"team-a", headers("X-Bitbucket-Event", "push"), body, Options{}, 400},
		"not JSON":                  {"team-a", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+sign([]byte("{"), hookSecret)), []byte("{"), Options{}, 400},
		"body over the limit":       {"team-a", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+good), body, Options{MaxBodyBytes: 100}, 413},
		"namespace that is no name": {"Team_A", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+good), body, Options{}, 404},
	} {
		t.Run(name, func(t *testing.T) {
			c := world(t)
			w := post(t, New(c, c, tc.opts), tc.ns, tc.h, tc.body)
			if w.Code != tc.status {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tc.status)
			}
			for _, ns := range []string{"team-a", "team-b"} {
				if got := requested(t, c, ns); len(got) != 0 {
					t.Fatalf("annotated %v", got)
				}
			}
		})
	}
}

func TestNoStackAndWrongSignatureReadTheSame(t *testing.T) {
	c := world(t)
	r := New(c, c, Options{})
	body := sample(t, "github-push.json")
	wrong := post(t, r, "team-a", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+sign(body, "guess")), body)
	none := post(t, r, "team-c", headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+sign(body, hookSecret)), body)
	if wrong.Code != none.Code || wrong.Body.String() != none.Body.String() {
		t.Fatalf("wrong signature: %d %q; no Stack: %d %q", wrong.Code, wrong.Body, none.Code, none.Body)
	}
}

func TestRateLimits(t *testing.T) {
	c := world(t)
	body := sample(t, "github-push.json")
	h := headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+sign(body, hookSecret))
	r := New(c, c, Options{NamespaceRate: 0.001, NamespaceBurst: 2, Rate: 0.001, Burst: 3})
	for i, want := range []int{202, 202, 429} {
		if w := post(t, r, "team-a", h, body); w.Code != want {
			t.Fatalf("team-a call %d: %d, want %d", i, w.Code, want)
		}
	}
	// Another namespace has its own limit, but the overall one (3) is spent now.
	if w := post(t, r, "team-b", h, body); w.Code != 202 {
		t.Fatalf("team-b: %d", w.Code)
	}
	if w := post(t, r, "team-b", h, body); w.Code != 429 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("over the overall limit: %d", w.Code)
	}
}
