package httpbackend

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/terrace-dev/terrace/internal/pki"
)

func TestAdmissionBoundsBytesInFlight(t *testing.T) {
	ctx := context.Background()
	a := newAdmission("test", prometheus.NewGauge(prometheus.GaugeOpts{Name: "test"}), 10<<20, 6<<20, 20*time.Millisecond)
	first, err := a.acquire(ctx, "a", 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	// Namespace a has 4 of its 6 MiB: 3 more are refused, at once.
	if _, err := a.acquire(ctx, "a", 3<<20); !errors.Is(err, errBusy) || !strings.Contains(err.Error(), "namespace a") {
		t.Fatalf("over the namespace's share: %v", err)
	}
	// Namespace b gets its share; then the total (10 MiB) is reached.
	second, err := a.acquire(ctx, "b", 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.acquire(ctx, "c", 2<<20); !errors.Is(err, errBusy) {
		t.Fatalf("over the total: %v", err)
	}
	// Room comes back with release, and a waiting transfer takes it.
	done := make(chan error, 1)
	a.wait = 10 * time.Second
	go func() {
		release, err := a.acquire(ctx, "c", 2<<20)
		if err == nil {
			release()
		}
		done <- err
	}()
	first()
	first() // releasing twice gives nothing back twice
	if err := <-done; err != nil {
		t.Fatalf("a transfer waiting for room released by another: %v", err)
	}
	second()
	if a.total.TryAcquire(10 << 20) {
		a.total.Release(10 << 20)
	} else {
		t.Fatal("bytes were not all given back")
	}
	if len(a.held) != 0 {
		t.Fatalf("namespace shares left behind: %v", a.held)
	}
}

// A large upload that finds no room is answered 503 with Retry-After
// before its body is read.
func TestBusyServerAnswers503WithRetryAfter(t *testing.T) {
	lim := newHandlerLimits(Options{MaxInflightBytes: 4 << 20, MaxInflightBytesPerNamespace: 4 << 20, MaxSmallInflightBytes: 1 << 20, AdmissionWait: 10 * time.Millisecond, BodyTimeout: time.Second})
	h := &Handler{
		Identify: func(*http.Request) (pki.Identity, error) { return pki.ControllerIdentity, nil },
		lim:      lim,
	}
	hold, err := h.lim.large.acquire(context.Background(), "ns", 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer hold()
	body := &countingBody{Reader: bytes.NewReader(make([]byte, 2<<20))}
	req := httptest.NewRequest(http.MethodPost, "/state/ns/app/default", body)
	req.ContentLength = 2 << 20
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "retry later") {
		t.Fatalf("busy server: %d Retry-After %q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	if body.read != 0 {
		t.Fatalf("%d bytes of the refused body were read", body.read)
	}
}

type countingBody struct {
	*bytes.Reader
	read int
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.Reader.Read(p)
	c.read += n
	return n, err
}
