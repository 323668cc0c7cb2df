package runner

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/grpc"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// planFileRunner serves one plan file honestly: its header, then its bytes.
type planFileRunner struct {
	runnerv1.UnimplementedRunnerServiceServer
	file []byte
}

func (r *planFileRunner) DownloadPlan(req *runnerv1.DownloadPlanRequest, s grpc.ServerStreamingServer[runnerv1.DownloadPlanResponse]) error {
	d := newDigester()
	d.Write(r.file)
	header := &runnerv1.PlanFileHeader{PlanId: req.GetPlanId(), Size: int64(len(r.file)), Digest: d.digest()}
	if err := s.Send(&runnerv1.DownloadPlanResponse{Part: &runnerv1.DownloadPlanResponse_Header{Header: header}}); err != nil {
		return err
	}
	return sendReader(bytes.NewReader(r.file), func(c []byte) error {
		return s.Send(&runnerv1.DownloadPlanResponse{Part: &runnerv1.DownloadPlanResponse_Chunk{Chunk: c}})
	})
}

// countingWriter keeps the largest single write and the total.
type countingWriter struct {
	total, largest int
	data           bytes.Buffer
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.total += len(p)
	w.largest = max(w.largest, len(p))
	w.data.Write(p)
	return len(p), nil
}

// The state tofu could not save is over the state server's limit by
// definition, and can be over the plan-file limit: DownloadPlanUpTo reads
// it under a bound of the caller's, passing it on in gRPC-sized pieces,
// where DownloadPlan refuses it.
func TestDownloadPlanUpToReadsAFileOverThePlanFileLimit(t *testing.T) {
	file := bytes.Repeat([]byte(`{"pad":"0123456789abcdef"}`), (3<<20)/26)
	c := startHostileRunner(t, &planFileRunner{file: file})
	c.SetLimits(Limits{PlanFileBytes: 1 << 20})
	var tooLarge *TooLargeError
	if _, err := c.DownloadPlan(t.Context(), "errored-state-p", &countingWriter{}); !errors.As(err, &tooLarge) {
		t.Fatalf("DownloadPlan of a 3 MiB file with a 1 MiB limit: %v, want a TooLargeError", err)
	}
	w := &countingWriter{}
	header, err := c.DownloadPlanUpTo(t.Context(), "errored-state-p", 4<<20, w)
	if err != nil {
		t.Fatalf("DownloadPlanUpTo with a 4 MiB bound: %v", err)
	}
	if header.GetSize() != int64(len(file)) || !bytes.Equal(w.data.Bytes(), file) {
		t.Fatalf("got %d bytes (header %d), want the %d-byte file", w.total, header.GetSize(), len(file))
	}
	if w.largest > ChunkSize {
		t.Fatalf("a single write of %d bytes: the file is to be passed on as it comes", w.largest)
	}
	if _, err := c.DownloadPlanUpTo(t.Context(), "errored-state-p", 2<<20, w); !errors.As(err, &tooLarge) {
		t.Fatalf("DownloadPlanUpTo with a 2 MiB bound: %v, want a TooLargeError", err)
	}
}
