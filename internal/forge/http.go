package forge

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Options bound the calls made to a forge.
type Options struct {
	// Transport sends the requests; a clone of http.DefaultTransport when
	// nil. The API URL comes from the Stack, so the caller decides from
	// where (and to which addresses) these calls may go.
	Transport http.RoundTripper
	// Timeout of one call; 30s when zero.
	Timeout time.Duration
	// MaxResponseBytes of one response body; 8 MiB when zero.
	MaxResponseBytes int64
	// MaxPages read of one list; 10 when zero (1,000 pull requests or
	// files on GitHub and GitLab, 500 on Gitea).
	MaxPages int
}

func (o Options) withDefaults() Options {
	if o.Transport == nil {
		o.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 8 << 20
	}
	if o.MaxPages <= 0 {
		o.MaxPages = 10
	}
	return o
}

// httpClient is the client the forges' libraries are given: each call
// timed out, each body bounded, and no redirect to another host (a token
// must not follow a redirect off the forge).
func (o Options) httpClient() *http.Client {
	return &http.Client{
		Transport: boundedTransport{next: o.Transport, limit: o.MaxResponseBytes},
		Timeout:   o.Timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("too many redirects")
			}
			if req.URL.Host != via[0].URL.Host || req.URL.Scheme != via[0].URL.Scheme {
				return fmt.Errorf("refused a redirect from %s to another host", via[0].URL.Host)
			}
			return nil
		},
	}
}

// boundedTransport fails a response body read past limit bytes.
type boundedTransport struct {
	next  http.RoundTripper
	limit int64
}

func (t boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > t.limit {
		resp.Body.Close()
		return nil, &responseTooLargeError{limit: t.limit}
	}
	resp.Body = &limitedBody{rc: resp.Body, left: t.limit, limit: t.limit}
	return resp, nil
}

type responseTooLargeError struct{ limit int64 }

func (e *responseTooLargeError) Error() string {
	return fmt.Sprintf("the forge's response is larger than %d bytes", e.limit)
}

type limitedBody struct {
	rc    io.ReadCloser
	left  int64
	limit int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly limit bytes from a longer one.
		var one [1]byte
		if n, _ := b.rc.Read(one[:]); n > 0 {
			return 0, &responseTooLargeError{limit: b.limit}
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
