package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// chunkPipe turns the chunks of a client stream (after its header) into a
// reader. The goroutine ends when the stream ends or the reader is closed.
func chunkPipe(recv func() ([]byte, bool, error)) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		for {
			chunk, isHeader, err := recv()
			if err == io.EOF {
				_ = pw.Close()
				return
			}
			if err != nil {
				_ = pw.CloseWithError(err)
				return
			}
			if isHeader {
				_ = pw.CloseWithError(statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "a header may only be the first message"))
				return
			}
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
	}()
	return pr
}

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func checkDigest(d string) error {
	if !digestPattern.MatchString(d) {
		return statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("digest %q must be sha256:<64 lowercase hex digits>", d))
	}
	return nil
}

func (s *Server) archiveLimits() artifact.Limits {
	return artifact.Limits{MaxCompressedSize: s.cfg.MaxArchiveBytes, TempDir: s.exec.TempDir()}
}

// Upload receives a tar.gz, verifies its digest, then extracts it as the source.
func (s *Server) Upload(stream runnerv1.RunnerService_UploadServer) error {
	release, err := s.acquire("upload")
	if err != nil {
		return err
	}
	defer release()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	header := first.GetHeader()
	if header == nil {
		return statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "the first upload message must be the header with the digest")
	}
	if err := checkDigest(header.GetDigest()); err != nil {
		return err
	}
	if err := s.exec.ResetSource(); err != nil {
		return s.toStatus(err)
	}
	pr := chunkPipe(func() ([]byte, bool, error) {
		msg, err := stream.Recv()
		if err != nil {
			return nil, false, err
		}
		return msg.GetChunk(), msg.GetHeader() != nil, nil
	})
	defer pr.Close()
	counter := &countingReader{r: pr}
	if err := artifact.ExtractVerified(counter, header.GetDigest(), s.exec.SourceDir(), s.archiveLimits()); err != nil {
		_ = s.exec.ResetSource()
		return s.toStatus(fmt.Errorf("failed to extract the uploaded source: %w", err))
	}
	release()
	return stream.SendAndClose(&runnerv1.UploadResponse{Source: &runnerv1.SourceInfo{Digest: header.GetDigest(), Size: counter.n}})
}

// externalUserAgent names the runner to servers of spec.source.url.
const externalUserAgent = "terrace-runner"

// externalFetch downloads external sources from the pod's network
// position; one client per process keeps its connections.
var externalFetch = artifact.NewExternalClient(externalUserAgent)

// Fetch downloads the source, from the controller or (external) from
// wherever a Stack points, and extracts it.
func (s *Server) Fetch(ctx context.Context, req *runnerv1.FetchRequest) (*runnerv1.FetchResponse, error) {
	release, err := s.acquire("fetch")
	if err != nil {
		return nil, err
	}
	defer release()
	client, err := s.fetchClient(req)
	if err != nil {
		return nil, err
	}
	if err := checkDigest(req.GetDigest()); err != nil {
		return nil, err
	}
	data, err := artifact.Fetch(ctx, client, req.GetUrl(), req.GetDigest(), s.cfg.MaxArchiveBytes)
	if err != nil {
		return nil, s.toStatus(err)
	}
	if err := s.exec.ResetSource(); err != nil {
		return nil, s.toStatus(err)
	}
	if err := artifact.ExtractBytes(data, req.GetDigest(), s.exec.SourceDir(), s.archiveLimits()); err != nil {
		_ = s.exec.ResetSource()
		return nil, s.toStatus(fmt.Errorf("failed to extract the fetched source: %w", err))
	}
	return &runnerv1.FetchResponse{Source: &runnerv1.SourceInfo{Digest: req.GetDigest(), Size: int64(len(data))}}, nil
}

// fetchClient checks the URL of a Fetch and picks the client for it: the
// runner's certificate goes only to the controller, over https.
func (s *Server) fetchClient(req *runnerv1.FetchRequest) (*http.Client, error) {
	u, err := url.Parse(req.GetUrl())
	if req.GetExternal() {
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "fetch needs an http or https URL with a host")
		}
		return externalFetch, nil
	}
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("fetch needs an https URL of the controller, not %q", req.GetUrl()))
	}
	return s.fetch, nil
}

// DownloadPlan streams a saved plan file.
func (s *Server) DownloadPlan(req *runnerv1.DownloadPlanRequest, stream runnerv1.RunnerService_DownloadPlanServer) error {
	release, err := s.acquire("download-plan")
	if err != nil {
		return err
	}
	defer release()
	f, err := s.exec.OpenPlanFile(req.GetPlanId())
	if err != nil {
		return s.toStatus(err)
	}
	defer f.Close()
	header := &runnerv1.PlanFileHeader{PlanId: req.GetPlanId(), Digest: f.Digest, Size: f.Size}
	if err := stream.Send(&runnerv1.DownloadPlanResponse{Part: &runnerv1.DownloadPlanResponse_Header{Header: header}}); err != nil {
		return err
	}
	buf := make([]byte, runner.ChunkSize)
	for {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			if err := stream.Send(&runnerv1.DownloadPlanResponse{Part: &runnerv1.DownloadPlanResponse_Chunk{Chunk: buf[:n]}}); err != nil {
				return err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return s.toStatus(fmt.Errorf("failed to read plan %s: %w", req.GetPlanId(), err))
		}
	}
}

// UploadPlan stores a plan file kept by the controller.
func (s *Server) UploadPlan(stream runnerv1.RunnerService_UploadPlanServer) error {
	release, err := s.acquire("upload-plan")
	if err != nil {
		return err
	}
	defer release()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	header := first.GetHeader()
	if header == nil {
		return statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "the first plan upload message must be the header with the plan id and digest")
	}
	pr := chunkPipe(func() ([]byte, bool, error) {
		msg, err := stream.Recv()
		if err != nil {
			return nil, false, err
		}
		return msg.GetChunk(), msg.GetHeader() != nil, nil
	})
	defer pr.Close()
	if err := s.exec.StorePlanFile(header.GetPlanId(), header.GetDigest(), pr, s.cfg.MaxPlanFileBytes); err != nil {
		return s.toStatus(err)
	}
	release()
	return stream.SendAndClose(&runnerv1.UploadPlanResponse{PlanId: header.GetPlanId()})
}
