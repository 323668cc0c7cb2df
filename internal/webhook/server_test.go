package webhook

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// The receiver over a real listener: a signed push is accepted, and the
// server stops when its context ends.
func TestServerServesTheReceiverUntilStopped(t *testing.T) {
	c := world(t)
	s := NewServer("127.0.0.1:0", New(c, c, Options{}))
	ready := make(chan net.Addr, 1)
	s.ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("server ended at start: %v", err)
	}
	if s.NeedLeaderElection() {
		t.Error("the receiver must serve on every replica")
	}
	body := sample(t, "github-push.json")
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr.String()+"/hooks/team-a", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", "sha256="+sign(body, hookSecret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("signed push answered %d", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + addr.String() + "/hooks/team-a"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET answered %v %v, want 405", resp, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("server ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop")
	}
}
