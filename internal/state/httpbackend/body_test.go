package httpbackend

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"testing"
)

// stalledBody yields its bytes, then fails as a read past the deadline does.
type stalledBody struct{ r io.Reader }

func (s *stalledBody) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, os.ErrDeadlineExceeded
	}
	return n, err
}

// The memory a body gets follows the bytes that arrived, never the length
// its client announced.
func TestReadBodyAllocatesAsBytesArrive(t *testing.T) {
	admitted := int64(0)
	grow := func(n int64) error { admitted += n; return nil }

	// 1 MiB announced, 100 bytes sent.
	_, err := readBody(&stalledBody{bytes.NewReader(make([]byte, 100))}, 1<<20, 64<<20, grow)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stalled body: %v", err)
	}
	if admitted != firstBodyChunk {
		t.Fatalf("100 bytes of an announced 1 MiB took %d bytes, want %d", admitted, firstBodyChunk)
	}

	// A whole body ends in one buffer of exactly its size.
	for _, size := range []int{0, 1, firstBodyChunk, firstBodyChunk + 1, 1<<20 + 3} {
		admitted = 0
		want := bytes.Repeat([]byte{'x'}, size)
		got, err := readBody(bytes.NewReader(want), int64(size), 64<<20, grow)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("a body of %d bytes: %d bytes back, %v", size, len(got), err)
		}
		if cap(got) != size || admitted != int64(size) {
			t.Fatalf("a body of %d bytes was held in %d bytes, %d admitted", size, cap(got), admitted)
		}
	}

	// Of unknown length, it is cut at the limit.
	_, err = readBody(bytes.NewReader(make([]byte, 5000)), -1, 4096, func(int64) error { return nil })
	var tooBig *http.MaxBytesError
	if !errors.As(err, &tooBig) {
		t.Fatalf("a body of unknown length over the limit: %v", err)
	}

	// A growth the budget refuses ends the read.
	refused := errors.New("no room")
	_, err = readBody(bytes.NewReader(make([]byte, 5*firstBodyChunk)), 5*firstBodyChunk, 64<<20, func(n int64) error {
		if n > firstBodyChunk {
			return refused
		}
		return nil
	})
	if !errors.Is(err, refused) {
		t.Fatalf("a growth refused by the budget: %v", err)
	}
}
