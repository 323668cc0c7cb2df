package chaos

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

// The harness restarts kube-apiserver and etcd itself: its own requests
// (a pod deleted, the CA rotated, a Stack read) must outlast those
// restarts, or the smoke test fails for the harness's reasons, not
// Terrace's. Every client of the harness goes through retryingTransport.

// controlPlaneOutage bounds how long one request keeps retrying: a restart
// of kube-apiserver or etcd takes seconds, a minute on a loaded machine.
const controlPlaneOutage = 2 * time.Minute

// harnessConfig is cfg with every request retried across control-plane
// restarts.
func harnessConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return &retryingTransport{next: rt, outage: controlPlaneOutage}
	}
	return c
}

// retryingTransport retries a request that got no answer (connection
// refused, reset, EOF) or an answer that says the server is not serving
// yet (503, or etcd unavailable behind it), until outage passes or the
// request's context ends. A write whose answer was lost may have been
// done: callers treat AlreadyExists and NotFound after a retry as done
// (see createKeep and deleteRunnerPod).
type retryingTransport struct {
	next   http.RoundTripper
	outage time.Duration
}

func (t *retryingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(t.outage)
	var body []byte
	if req.Body != nil && req.GetBody == nil {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	for {
		attempt := req.Clone(req.Context())
		switch {
		case body != nil:
			attempt.Body = io.NopCloser(bytes.NewReader(body))
		case req.GetBody != nil:
			b, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			attempt.Body = b
		}
		resp, err := t.next.RoundTrip(attempt)
		if !retryable(resp, err) || time.Now().After(deadline) || isWatch(req) {
			return resp, err
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(250 * time.Millisecond): // between attempts, not a wait for a condition
		}
	}
}

// retryable says the server did not handle the request: it was down,
// restarting, or not yet connected to etcd.
func retryable(resp *http.Response, err error) bool {
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return false
		}
		var netErr net.Error
		return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
			errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr)
	}
	return resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout
}

// isWatch leaves watches alone: their callers re-establish them.
func isWatch(req *http.Request) bool {
	return req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1"
}
