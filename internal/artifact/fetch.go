package artifact

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// Fetch downloads the artifact at url with client, refuses a body larger
// than maxBytes, and returns it only if its digest is digest. The client
// carries the caller's TLS configuration (for the artifact server: the
// runner's client certificate and the controller's CA).
func Fetch(ctx context.Context, client *http.Client, url, digest string, maxBytes int64) ([]byte, error) {
	if err := validateDigest(digest); err != nil {
		return nil, err
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxCompressedSize
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("failed to create request for %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to fetch artifact %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, &FetchStatusError{URL: url, StatusCode: resp.StatusCode, Message: string(msg)}
	}
	if resp.ContentLength > maxBytes {
		return nil, fmt.Errorf("%w: artifact %s is %d bytes, more than %d", ErrLimitExceeded, url, resp.ContentLength, maxBytes)
	}
	data, err := io.ReadAll(&limitedReader{r: resp.Body, limit: maxBytes, what: "artifact " + url})
	if err != nil {
		return nil, fmt.Errorf("failed to read artifact %s: %w", url, err)
	}
	if err := VerifyDigest(data, digest); err != nil {
		return nil, fmt.Errorf("failed to verify artifact %s: %w", url, err)
	}
	return data, nil
}

// FetchStatusError is a non-200 answer to Fetch. 410 Gone means the
// artifact was superseded: the caller should re-read the source's status.
type FetchStatusError struct {
	URL        string
	StatusCode int
	Message    string
}

func (e *FetchStatusError) Error() string {
	return fmt.Sprintf("failed to fetch artifact %s: server answered %d %s: %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}
