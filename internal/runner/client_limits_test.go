package runner

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/terrace-dev/terrace/internal/pki"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// hostileRunner answers like a runner whose module (or image) tries to
// exhaust the controller: every stream goes on for up to a GiB.
type hostileRunner struct {
	runnerv1.UnimplementedRunnerServiceServer
	sent atomic.Int64 // bytes the controller took before it hung up
}

const hostileBytes = 1 << 30

func (h *hostileRunner) stream(ctx context.Context, send func([]byte) error) error {
	chunk := make([]byte, ChunkSize)
	for i := range chunk {
		chunk[i] = 'x'
	}
	for n := 0; n < hostileBytes; n += len(chunk) {
		if err := send(chunk); err != nil {
			return err
		}
		h.sent.Add(int64(len(chunk)))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// Plan sends 96 MiB of plan JSON, then its result.
func (h *hostileRunner) Plan(_ *runnerv1.PlanRequest, s grpc.ServerStreamingServer[runnerv1.PlanResponse]) error {
	chunk := make([]byte, ChunkSize)
	const total = 96 << 20
	for n := 0; n < total; n += len(chunk) {
		if err := s.Send(&runnerv1.PlanResponse{Event: &runnerv1.PlanResponse_JsonChunk{JsonChunk: chunk}}); err != nil {
			return err
		}
	}
	return s.Send(&runnerv1.PlanResponse{Event: &runnerv1.PlanResponse_Result{Result: &runnerv1.PlanResult{PlanId: "p", HasChanges: true, JsonSize: total}}})
}

func (h *hostileRunner) ShowPlan(_ *runnerv1.ShowPlanRequest, s grpc.ServerStreamingServer[runnerv1.ShowPlanResponse]) error {
	return h.stream(s.Context(), func(c []byte) error { return s.Send(&runnerv1.ShowPlanResponse{Chunk: c}) })
}

func (h *hostileRunner) Output(_ *runnerv1.OutputRequest, s grpc.ServerStreamingServer[runnerv1.OutputResponse]) error {
	return h.stream(s.Context(), func(c []byte) error {
		return s.Send(&runnerv1.OutputResponse{Name: "secret", TypeJson: []byte(`"string"`), ValueChunk: c})
	})
}

func (h *hostileRunner) DownloadPlan(_ *runnerv1.DownloadPlanRequest, s grpc.ServerStreamingServer[runnerv1.DownloadPlanResponse]) error {
	// A header that lies small, then a GiB.
	if err := s.Send(&runnerv1.DownloadPlanResponse{Part: &runnerv1.DownloadPlanResponse_Header{Header: &runnerv1.PlanFileHeader{PlanId: "p", Size: 1 << 20, Digest: "sha256:00"}}}); err != nil {
		return err
	}
	return h.stream(s.Context(), func(c []byte) error {
		return s.Send(&runnerv1.DownloadPlanResponse{Part: &runnerv1.DownloadPlanResponse_Chunk{Chunk: c}})
	})
}

// startHostileRunner serves h (a hostileRunner, or another fake) over mutual TLS as the runner identity and
// returns the controller's real client for it.
func startHostileRunner(t *testing.T, h runnerv1.RunnerServiceServer) *Client {
	t.Helper()
	runnerIdentity := pki.RunnerIdentity("team-a", "web", "run-1")
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(id pki.Identity) pki.CertificateSource {
		l, err := authority.Issue(pki.LeafRequest{Identity: id, Validity: time.Hour, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return pki.StaticCertificate(c)
	}
	runnerCert := leaf(runnerIdentity)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(pki.ServerTLSConfig(runnerCert, authority, nil))))
	runnerv1.RegisterRunnerServiceServer(srv, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	controller := leaf(pki.ControllerIdentity)
	c, err := Dial(t.Context(), ln.Addr().String(), ClientTLSConfig(controller, authority, runnerIdentity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A runner that answers with endless plan JSON, readable plan, outputs or
// plan file is cut off at the controller's limit with an error that names
// it; the controller never holds more than the limit.
func TestClientRefusesOversizedRunnerAnswers(t *testing.T) {
	h := &hostileRunner{}
	c := startHostileRunner(t, h)
	limits := Limits{PlanJSONBytes: 8 << 20, ShowPlanBytes: 6 << 20, OutputsBytes: 3 << 20, PlanFileBytes: 5 << 20}
	c.SetLimits(limits)

	for _, tc := range []struct {
		what  string
		limit int64
		call  func(ctx context.Context) error
	}{
		{"readable plan", limits.ShowPlanBytes, func(ctx context.Context) error {
			_, err := c.ShowPlan(ctx, "p", runnerv1.PlanFormat_PLAN_FORMAT_JSON)
			return err
		}},
		{"outputs", limits.OutputsBytes, func(ctx context.Context) error { _, err := c.Outputs(ctx); return err }},
		{"plan file", 1 << 20, func(ctx context.Context) error {
			_, err := c.DownloadPlan(ctx, "p", discardWriter{})
			return err
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			h.sent.Store(0)
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ctx, cancel := context.WithCancel(t.Context())
			err := tc.call(ctx)
			cancel()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatalf("a GiB of %s was accepted", tc.what)
			}
			var tooLarge *TooLargeError
			if tc.what == "plan file" {
				// The header announced 1 MiB: the answer is cut off there.
				if !strings.Contains(err.Error(), "longer than the 1048576 bytes its header announced") {
					t.Fatalf("plan file error: %v", err)
				}
			} else if !errors.As(err, &tooLarge) || tooLarge.What != tc.what || tooLarge.Limit != tc.limit ||
				!strings.Contains(err.Error(), "larger than the controller's limit") {
				t.Fatalf("error %v, want a TooLargeError for %s at %d bytes", err, tc.what, tc.limit)
			}
			// gRPC buffers a little ahead of the reader; nowhere near the GiB.
			if sent := h.sent.Load(); sent > tc.limit+32<<20 {
				t.Fatalf("the runner got %d bytes out before the controller stopped reading (limit %d)", sent, tc.limit)
			}
			if grown := int64(after.TotalAlloc - before.TotalAlloc); grown > 8*tc.limit+64<<20 {
				t.Fatalf("the controller allocated %d bytes reading %s limited to %d", grown, tc.what, tc.limit)
			}
		})
	}
}

// A plan whose JSON is over the limit is kept without its JSON: the
// controller holds at most the limit while it reads the rest.
func TestClientDropsOversizedPlanJSON(t *testing.T) {
	c := startHostileRunner(t, &hostileRunner{})
	c.SetLimits(Limits{PlanJSONBytes: 8 << 20})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	p, err := c.Plan(t.Context(), &runnerv1.PlanRequest{}, nil)
	if err != nil {
		t.Fatalf("a plan with 96 MiB of JSON: %v", err)
	}
	if !p.JSONOmitted || p.JSON != nil || p.GetPlanId() != "p" || !p.GetHasChanges() {
		t.Fatalf("plan: omitted=%v, %d bytes of JSON, id %q; want the plan without its JSON", p.JSONOmitted, len(p.JSON), p.GetPlanId())
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.HeapAlloc > before.HeapAlloc+16<<20 {
		t.Fatalf("the controller retains %d MiB after reading a plan whose JSON was dropped", (after.HeapAlloc-before.HeapAlloc)>>20)
	}
}

// An announced plan file over the limit is refused before any of it is read.
func TestClientRefusesAnnouncedOversizedPlanFile(t *testing.T) {
	h := &hostileRunner{}
	c := startHostileRunner(t, h)
	c.SetLimits(Limits{PlanFileBytes: 512 << 10})
	_, err := c.DownloadPlan(t.Context(), "p", discardWriter{})
	var tooLarge *TooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.What != "plan file" || tooLarge.Limit != 512<<10 {
		t.Fatalf("DownloadPlan of an announced 1 MiB plan with a 512 KiB limit: %v", err)
	}
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
