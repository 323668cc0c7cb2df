package httpbackend

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
)

// firstBodyChunk is the memory a request body gets before its first bytes
// are read; it doubles as they arrive, up to the announced length.
const firstBodyChunk = 8 << 10

// errBodyTimeout says a request body did not arrive before its deadline (408).
var errBodyTimeout = errors.New("the request body did not arrive in time")

// errBodyRead says a request body could not be read (400).
var errBodyRead = errors.New("failed to read the request body")

// bodyTooLargeError says a body is over its limit (413).
type bodyTooLargeError struct {
	what  string
	limit int64
}

func (e *bodyTooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than the limit of %d bytes", e.what, e.limit)
}

// readRequestBody reads r's body whole, at most limit bytes, and returns
// it with a func that gives the bytes it holds back to the admission.
//
// The announced Content-Length is never what memory is allocated by: the
// body gets firstBodyChunk, then twice as much each time it fills up,
// capped at the announced length, so a client that announces a body and
// sends nothing holds almost nothing. A large body (over 1 MiB, or of
// unknown length) is admitted whole before it is read, against the
// budget of large states; a small one is admitted as it grows, against
// the budget of small bodies. Either must arrive before a deadline of
// the body timeout plus a second per MiB announced.
func (h *Handler) readRequestBody(w http.ResponseWriter, r *http.Request, key state.Key, what string, limit int64) (body []byte, release func(), err error) {
	if r.ContentLength > limit {
		// Refused before a byte of the body is read.
		return nil, nil, &bodyTooLargeError{what: what, limit: limit}
	}
	lim := h.limits()
	announced := r.ContentLength
	size := announced
	if size < 0 {
		size = limit // unknown length: admit the worst case
	}
	held := &heldBytes{}
	grow := func(int64) error { return nil }
	if size > smallBodyBytes || announced < 0 {
		release, err := lim.large.acquire(r.Context(), key.Namespace, size)
		if err != nil {
			return nil, nil, err
		}
		held.add(release)
	} else {
		grow = func(n int64) error {
			release, err := lim.small.acquire(r.Context(), key.Namespace, n)
			if err != nil {
				return err
			}
			held.add(release)
			return nil
		}
	}
	// net/http clears the deadline when it starts reading on in the
	// background at the body's end.
	_ = http.NewResponseController(w).SetReadDeadline(lim.transferDeadline(size))
	body, err = readBody(http.MaxBytesReader(w, r.Body, limit), announced, limit, grow)
	if err != nil {
		held.release()
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, nil, &bodyTooLargeError{what: what, limit: limit}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, nil, fmt.Errorf("%w: %s must arrive within %s, and arrived %s", errBodyTimeout, what, lim.transferTime(size).Round(time.Second), describeArrived(len(body), announced))
		case errors.Is(err, errBusy):
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w: %w", errBodyRead, err)
	}
	return body, held.release, nil
}

func describeArrived(n int, announced int64) string {
	if announced >= 0 {
		return fmt.Sprintf("%d of %d bytes", n, announced)
	}
	return fmt.Sprintf("%d bytes", n)
}

// readBody reads body into memory allocated as its bytes arrive: the
// buffer starts at firstBodyChunk and doubles when full, never beyond
// the announced length (net/http ends the body there), or limit+1 when
// the length is unknown. grow admits each increase before it is made.
// On error it also returns what was read, for the message.
func readBody(body io.Reader, announced, limit int64, grow func(n int64) error) ([]byte, error) {
	ceiling := limit + 1
	if announced >= 0 {
		ceiling = min(announced, limit)
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= ceiling {
				if announced >= 0 {
					return buf, nil // all announced bytes arrived: the body ends here
				}
				return buf, &http.MaxBytesError{Limit: limit}
			}
			next := min(max(2*int64(cap(buf)), firstBodyChunk), ceiling)
			if err := grow(next - int64(cap(buf))); err != nil {
				return buf, err
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// heldBytes collects the releases of what one request was admitted.
type heldBytes struct{ releases []func() }

func (h *heldBytes) add(release func()) { h.releases = append(h.releases, release) }

func (h *heldBytes) release() {
	for _, r := range h.releases {
		r()
	}
	h.releases = nil
}
