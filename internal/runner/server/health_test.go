package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

func TestRenderTarget(t *testing.T) {
	data := map[string]any{"outputs": map[string]any{"url": "http://svc:8080", "port": float64(5432)}}
	tests := []struct{ text, want, wantErr string }{
		{text: "{{ .outputs.url }}/healthz", want: "http://svc:8080/healthz"},
		{text: "db:{{ .outputs.port }}", want: "db:5432"},
		{text: "{{ .outputs.missing }}", wantErr: "cannot be filled from the outputs"},
		{text: "{{ .outputs.url ", wantErr: "does not parse"},
	}
	for _, tt := range tests {
		got, err := renderTarget(tt.text, data)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("renderTarget(%q) error %v, want %q", tt.text, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("renderTarget(%q) = %q, %v; want %q", tt.text, got, err, tt.want)
		}
	}
}

func TestHealthChecksAgainstARealServer(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Healthy from the third request on: the check keeps trying.
		if calls.Add(1) < 3 {
			http.Error(w, "secret-body-starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, "status: ok")
	}))
	defer srv.Close()
	data := map[string]any{"outputs": map[string]any{"url": srv.URL, "addr": strings.TrimPrefix(srv.URL, "http://")}}
	s := &Server{}
	ctx := context.Background()

	res := s.runCheck(ctx, &runnerv1.HealthCheck{Name: "web", Type: runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP,
		Target: "{{ .outputs.url }}/healthz", BodyMatch: "status: ok", TimeoutMs: 10_000}, data)
	if !res.GetPassed() || res.GetAttempts() != 3 {
		t.Errorf("http check: passed %v after %d attempts (%s), want a pass on the third", res.GetPassed(), res.GetAttempts(), res.GetMessage())
	}

	res = s.runCheck(ctx, &runnerv1.HealthCheck{Name: "body", Type: runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP,
		Target: "{{ .outputs.url }}", BodyMatch: "^never$", TimeoutMs: 1}, data)
	if res.GetPassed() || !strings.Contains(res.GetMessage(), "does not match") || strings.Contains(res.GetMessage(), "status: ok") {
		t.Errorf("body mismatch: passed %v, message %q", res.GetPassed(), res.GetMessage())
	}

	res = s.runCheck(ctx, &runnerv1.HealthCheck{Name: "tcp", Type: runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP, Target: "{{ .outputs.addr }}"}, data)
	if !res.GetPassed() {
		t.Errorf("tcp check failed: %s", res.GetMessage())
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	_ = lis.Close()
	res = s.runCheck(ctx, &runnerv1.HealthCheck{Name: "down", Type: runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP, Target: closed, TimeoutMs: 1}, data)
	if res.GetPassed() || !strings.Contains(res.GetMessage(), "connect failed") {
		t.Errorf("closed port: passed %v, message %q", res.GetPassed(), res.GetMessage())
	}
}

func TestHTTPCheckNeverQuotesTheBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "password=hunter2", http.StatusInternalServerError)
	}))
	defer srv.Close()
	err := checkHTTP(context.Background(), srv.URL, 200, nil)
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "answered 500, expected 200") {
		t.Errorf("error %v", err)
	}
	if err := checkHTTP(context.Background(), "file:///etc/passwd", 200, nil); err == nil || !strings.Contains(err.Error(), "http or https") {
		t.Errorf("a file URL was fetched: %v", err)
	}
}
