package devnode

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func hostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

func TestHTTPProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte("ok"))
		case "/redirect":
			http.Redirect(w, r, "/ok", http.StatusFound)
		default:
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, port := hostPort(t, srv.Listener.Addr().String())
	c := &corev1.Container{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	target := probeTarget{podIP: host, container: c}
	for path, want := range map[string]bool{"/ok": true, "/redirect": true, "/down": false} {
		p := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}}}
		if ok, msg := runProbe(context.Background(), p, target); ok != want {
			t.Errorf("%s: ok=%v (%s), want %v", path, ok, msg, want)
		}
	}
}

func TestTCPProbe(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, port := hostPort(t, lis.Addr().String())
	target := probeTarget{podIP: host, container: &corev1.Container{}}
	p := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}}
	if ok, msg := runProbe(context.Background(), p, target); !ok {
		t.Fatalf("open port: %s", msg)
	}
	_ = lis.Close()
	if ok, _ := runProbe(context.Background(), p, target); ok {
		t.Fatal("closed port reported healthy")
	}
}

func TestGRPCProbe(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	hs.SetServingStatus("svc", healthpb.HealthCheckResponse_NOT_SERVING)
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	host, port := hostPort(t, lis.Addr().String())
	target := probeTarget{podIP: host, container: &corev1.Container{}}
	overall := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(port)}}}
	if ok, msg := runProbe(context.Background(), overall, target); !ok {
		t.Fatalf("serving server: %s", msg)
	}
	svc := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(port), Service: ptr.To("svc")}}}
	if ok, _ := runProbe(context.Background(), svc, target); ok {
		t.Fatal("NOT_SERVING service reported healthy")
	}
	hs.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	if ok, msg := runProbe(context.Background(), svc, target); !ok {
		t.Fatalf("SERVING service: %s", msg)
	}
}

func TestProbeLoopAppliesThresholds(t *testing.T) {
	var mu sync.Mutex
	healthy := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !healthy {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	host, port := hostPort(t, srv.Listener.Addr().String())
	p := &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(int32(port))}},
		PeriodSeconds:    1,
		FailureThreshold: 2,
	}
	reports := make(chan bool, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go probeLoop(ctx, readinessProbe, p, probeTarget{podIP: host, container: &corev1.Container{}}, func(ok bool, _ string) { reports <- ok })

	expect := func(want bool) {
		t.Helper()
		select {
		case got := <-reports:
			if got != want {
				t.Fatalf("report %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no report %v", want)
		}
	}
	expect(true)
	failingSince := time.Now()
	mu.Lock()
	healthy = false
	mu.Unlock()
	expect(false)
	// Two failures one period apart are needed: at least one period passed.
	if time.Since(failingSince) < time.Second {
		t.Fatalf("unready after %s: the failure threshold was ignored", time.Since(failingSince))
	}
}

// TestReadinessIsSeenAtItsFirstPass: a readiness probe that fails while the
// process starts is retried quickly, not after its period (an hour here,
// far beyond the test's wait).
func TestReadinessIsSeenAtItsFirstPass(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, port := hostPort(t, srv.Listener.Addr().String())
	p := &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(int32(port))}},
		PeriodSeconds:    3600,
		FailureThreshold: 1,
	}
	reports := make(chan bool, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go probeLoop(ctx, readinessProbe, p, probeTarget{podIP: host, container: &corev1.Container{}}, func(ok bool, _ string) { reports <- ok })
	select {
	case ok := <-reports:
		if !ok {
			t.Fatal("a readiness probe that had never passed reported its failures")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first passing readiness probe waited for the probe's period")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 4 {
		t.Errorf("probed %d times, want 3 failures then the pass", calls)
	}
}
