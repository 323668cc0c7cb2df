package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// The source of a run: uploaded by the controller, fetched by the runner,
// or cloned from Git.

// Upload sends the tar.gz in r, whose digest is "sha256:<hex>", as the source.
func (c *Client) Upload(ctx context.Context, digest string, r io.Reader) (*runnerv1.SourceInfo, error) {
	stream, err := c.rpc.Upload(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&runnerv1.UploadRequest{Part: &runnerv1.UploadRequest_Header{Header: &runnerv1.UploadHeader{Digest: digest}}}); err != nil {
		return nil, closeAndRecvErr(stream.CloseAndRecv, err)
	}
	if err := sendReader(r, func(chunk []byte) error {
		return stream.Send(&runnerv1.UploadRequest{Part: &runnerv1.UploadRequest_Chunk{Chunk: chunk}})
	}); err != nil {
		return nil, closeAndRecvErr(stream.CloseAndRecv, err)
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetSource(), nil
}

// closeAndRecvErr returns the server's status when a send failed because
// the server already answered (io.EOF), else the send error.
func closeAndRecvErr[T any](closeAndRecv func() (T, error), sendErr error) error {
	if errors.Is(sendErr, io.EOF) {
		if _, err := closeAndRecv(); err != nil {
			return err
		}
	}
	return sendErr
}

func sendReader(r io.Reader, send func([]byte) error) error {
	// The buffer is reused, by this upload and the next: each run uploads
	// its source, and a new ChunkSize buffer per upload was 22% of what
	// the controller allocated at 10,000 Stacks. send gets a copy.
	bufp := chunkBuffers.Get().(*[]byte)
	defer chunkBuffers.Put(bufp)
	buf := *bufp
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if serr := send(bytes.Clone(buf[:n])); serr != nil {
				return serr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failed to read: %w", err)
		}
	}
}

// chunkBuffers holds ChunkSize read buffers for sendReader.
var chunkBuffers = sync.Pool{New: func() any { b := make([]byte, ChunkSize); return &b }}

// Fetch makes the runner download the source from the controller.
func (c *Client) Fetch(ctx context.Context, url, digest string) (*runnerv1.SourceInfo, error) {
	resp, err := c.rpc.Fetch(ctx, &runnerv1.FetchRequest{Url: url, Digest: digest})
	if err != nil {
		return nil, err
	}
	return resp.GetSource(), nil
}

// FetchExternal makes the runner download the source from a URL outside
// the controller (a Stack's spec.source.url), from the runner pod's own
// network position.
func (c *Client) FetchExternal(ctx context.Context, url, digest string) (*runnerv1.SourceInfo, error) {
	resp, err := c.rpc.Fetch(ctx, &runnerv1.FetchRequest{Url: url, Digest: digest, External: true})
	if err != nil {
		return nil, err
	}
	return resp.GetSource(), nil
}

// Clone has the runner clone a Git repository (spec.source.git) from its
// pod's network position and make the commit's tree the source.
// credentialsDir is where the pod mounts the credentials Secret, or "".
func (c *Client) Clone(ctx context.Context, url string, ref *runnerv1.GitRef, credentialsDir string) (*runnerv1.CloneResponse, error) {
	return c.rpc.Clone(ctx, &runnerv1.CloneRequest{Url: url, Ref: ref, CredentialsDir: credentialsDir})
}
