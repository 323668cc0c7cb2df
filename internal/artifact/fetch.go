package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// ErrUnreachable is wrapped by every error about a source server that
// could not be reached or broke off its answer.
var ErrUnreachable = errors.New("source server unreachable")

// Fetch downloads the artifact at rawURL with client, refuses a body larger
// than maxBytes, and returns it only if its digest is digest. The client
// carries the caller's TLS configuration (for the artifact server: the
// runner's client certificate and the controller's CA). No error quotes
// the body or the digest of what was received: the server may not be the
// caller's to read.
func Fetch(ctx context.Context, client *http.Client, rawURL, digest string, maxBytes int64) ([]byte, error) {
	if err := validateDigest(digest); err != nil {
		return nil, err
	}
	body, err := Open(ctx, client, rawURL, maxBytes)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	if err := VerifyDigest(data, digest); err != nil {
		return nil, fmt.Errorf("failed to verify the artifact from %s: %w", describeURL(rawURL), err)
	}
	return data, nil
}

// Open starts downloading rawURL with client and returns the body, which
// fails with ErrLimitExceeded once more than maxBytes were read. A non-200
// answer is a *FetchStatusError; its body is never read.
func Open(ctx context.Context, client *http.Client, rawURL string, maxBytes int64) (io.ReadCloser, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxCompressedSize
	}
	where := describeURL(rawURL)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, fmt.Errorf("invalid artifact URL %s: %w", where, unwrapURLError(err))
	}
	resp, err := client.Do(req)
	if err != nil {
		cause := unwrapURLError(err)
		var refused *HostNotAllowedError
		if errors.As(cause, &refused) || ctx.Err() != nil {
			return nil, fmt.Errorf("failed to fetch %s: %w", where, cause)
		}
		return nil, fmt.Errorf("%w: failed to fetch %s: %w", ErrUnreachable, where, cause)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, &FetchStatusError{URL: where, Host: resp.Request.URL.Host, StatusCode: resp.StatusCode}
	}
	if resp.ContentLength > maxBytes {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("%w: artifact %s is %d bytes, more than %d", ErrLimitExceeded, where, resp.ContentLength, maxBytes)
	}
	return &downloadBody{
		limited: &limitedReader{r: resp.Body, limit: maxBytes, what: "artifact " + where},
		closer:  resp.Body,
		where:   where,
	}, nil
}

// downloadBody is a bounded response body whose read errors say what
// was being read.
type downloadBody struct {
	limited io.Reader
	closer  io.Closer
	where   string
}

func (b *downloadBody) Read(p []byte) (int, error) {
	n, err := b.limited.Read(p)
	if err != nil && err != io.EOF && !errors.Is(err, ErrLimitExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: failed to read the artifact from %s: %w", ErrUnreachable, b.where, err)
	}
	return n, err
}

func (b *downloadBody) Close() error { return b.closer.Close() }

// FetchStatusError is a non-200 answer to Fetch. 410 Gone means the
// artifact was superseded: the caller should re-read the source's status.
// It carries no part of the answer's body.
type FetchStatusError struct {
	// URL is the requested URL without credentials or query.
	URL string
	// Host answered (after redirects).
	Host       string
	StatusCode int
}

func (e *FetchStatusError) Error() string {
	return fmt.Sprintf("HTTP %d from %s", e.StatusCode, e.Host)
}

// HostNotAllowedError refuses a URL whose host is not on the allowlist;
// no connection was made.
type HostNotAllowedError struct {
	Host string
}

func (e *HostNotAllowedError) Error() string {
	return fmt.Sprintf("host %s is not an allowed source host", e.Host)
}

// describeURL names a URL in messages without its credentials or query,
// which may carry tokens.
func describeURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "an invalid URL"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// unwrapURLError drops net/http's *url.Error, whose message repeats the
// whole URL, credentials and query included.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Timeouts of the source clients; a whole download is bounded by the
// caller's context (the run's timeout) and by fetchTimeout.
const (
	dialTimeout           = 30 * time.Second
	responseHeaderTimeout = time.Minute
	fetchTimeout          = 10 * time.Minute
	maxRedirects          = 5
)

// NewSourceClient returns the client the controller downloads Flux
// artifacts with. It connects only to hosts on allowed, checked before
// each connection and at each redirect; it uses no proxy and presents no
// certificate; every phase has a timeout.
func NewSourceClient(allowed *HostAllowlist, userAgent string) *http.Client {
	if allowed == nil {
		allowed = &HostAllowlist{} // allows nothing
	}
	return newDownloadClient(nil, allowed, userAgent)
}

// NewExternalClient returns the client a runner downloads a Stack's
// spec.source.url with, from its pod's network position: the system's
// CAs, the pod's proxy settings, no client certificate, timeouts on every
// phase and at most a few redirects.
func NewExternalClient(userAgent string) *http.Client {
	return newDownloadClient(http.ProxyFromEnvironment, nil, userAgent)
}

// newDownloadClient is a client with a timeout on every phase and at most
// maxRedirects redirects; with allowed, only its hosts are connected to,
// at the first request and at each redirect.
func newDownloadClient(proxy func(*http.Request) (*url.URL, error), allowed *HostAllowlist, userAgent string) *http.Client {
	base := &http.Transport{
		Proxy:                 proxy,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: responseHeaderTimeout,
		MaxIdleConns:          4,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{
		Transport: &guardedTransport{base: base, allowed: allowed, userAgent: userAgent},
		Timeout:   fetchTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("stopped after %d redirects", maxRedirects)
			}
			if allowed != nil && !allowed.Allows(req.URL) {
				return &HostNotAllowedError{Host: req.URL.Host}
			}
			return nil
		},
	}
}

// guardedTransport refuses hosts off its allowlist (when it has one)
// before any connection, and names its client in User-Agent.
type guardedTransport struct {
	base      http.RoundTripper
	allowed   *HostAllowlist
	userAgent string
}

func (t *guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.allowed != nil && !t.allowed.Allows(req.URL) {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, &HostNotAllowedError{Host: req.URL.Host}
	}
	if t.userAgent != "" {
		req = req.Clone(req.Context())
		req.Header.Set("User-Agent", t.userAgent)
	}
	return t.base.RoundTrip(req)
}
