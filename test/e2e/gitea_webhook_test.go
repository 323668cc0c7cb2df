package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// TestGiteaPushWebhookReconcilesAtOnce: a Stack that follows a branch of a
// real Gitea with an hour's interval applies a pushed commit within
// seconds, because Gitea's signed push webhook reaches the controller's
// receiver (--webhook-bind-address) and asks for a reconcile; the same
// payload signed with another secret is refused and asks for nothing.
func TestGiteaPushWebhookReconcilesAtOnce(t *testing.T) {
	ctx := context.Background()
	g := startGitea(ctx, t)
	e := newStackEnv(t)
	defer logPodsOnFailure(t, e.cs, giteaNamespace, e.ns)
	stackCtl.mu.Lock()
	receiver := stackCtl.ctrl.webhookURL + "/hooks/" + e.ns
	stackCtl.mu.Unlock()

	repo := g.createRepo(t, "hooked-"+randomHex(3))
	module := func(v string) string {
		return fmt.Sprintf("resource \"terraform_data\" \"site\" { input = %q }\noutput \"site\" { value = terraform_data.site.output }\n", v)
	}
	first := repo.push(t, "main", map[string]string{"main.tf": module("one")}, "first")
	secret := randomHex(16)
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hook"}, StringData: map[string]string{"token": secret}})
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "hooked"},
		Spec: terracev1.StackSpec{
			Source: terracev1.StackSource{Git: &terracev1.GitSource{
				URL: repo.InClusterCloneURL, Ref: &terracev1.GitRef{Branch: "main"},
				Webhook: &terracev1.GitWebhook{SecretRef: terracev1.LocalObjectReference{Name: "hook"}},
			}},
			// Only the webhook can make it look again within the test.
			Interval:    &metav1.Duration{Duration: time.Hour},
			ApprovePlan: terracev1.ApprovePlanAuto,
		},
	})
	atCommit := func(sha string) func(*terracev1.Stack) error {
		return func(s *terracev1.Stack) error {
			if err := readyAt(s); err != nil {
				return err
			}
			if s.Status.LastAppliedRevision != "main@sha1:"+sha {
				return fmt.Errorf("applied %q, want main@sha1:%s", s.Status.LastAppliedRevision, sha)
			}
			return nil
		}
	}
	e.waitStack(t, "hooked", stackTimeout, "the first commit applied", atCommit(first))

	// Gitea signs its push webhooks with the Stack's secret; a capture
	// server gets the same deliveries, to replay one with a wrong signature.
	captured := make(chan []byte, 8)
	capture := newLinkServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		captured <- body
	}))
	repo.addWebhook(t, receiver, secret, "push")
	repo.addWebhook(t, capture.URL, secret, "push")

	pushed := time.Now()
	second := repo.push(t, "main", map[string]string{"main.tf": module("two")}, "second")
	e.waitStack(t, "hooked", 2*time.Minute, "the pushed commit applied through the webhook", atCommit(second))
	t.Logf("push to Ready at the pushed commit through Gitea's webhook: %s (interval 1h)", time.Since(pushed).Round(100*time.Millisecond))

	var payload []byte
	select {
	case payload = <-captured:
	case <-time.After(30 * time.Second):
		t.Fatal("gitea delivered no push webhook to the capture server")
	}
	before := e.getStack(t, "hooked").Annotations[terracev1.ReconcileRequestAnnotation]
	for name, signature := range map[string]string{"another secret": sign(payload, "not-"+secret), "no signature": ""} {
		req, _ := http.NewRequest(http.MethodPost, receiver, bytes.NewReader(payload))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Gitea-Event", "push")
		if signature != "" {
			req.Header.Set("X-Gitea-Signature", signature)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Gitea's push signed with %s answered %d %s, want 401", name, resp.StatusCode, strings.TrimSpace(string(body)))
		}
	}
	if after := e.getStack(t, "hooked").Annotations[terracev1.ReconcileRequestAnnotation]; after != before {
		t.Errorf("a refused webhook asked for a reconcile: requestedAt %q -> %q", before, after)
	}
}

// sign is a body's HMAC-SHA256 with secret, hex, as Gitea signs webhooks.
func sign(body []byte, secret string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}
