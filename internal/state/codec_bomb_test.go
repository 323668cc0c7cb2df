package state

import (
	"bytes"
	"compress/gzip"
	"errors"
	"testing"
)

// TestOpenRefusesAGzipBomb: a chunk planted by someone who may write the
// namespace's Secrets inflates past MaxOpenedBytes; Open refuses it with a
// CorruptError instead of holding it all in the shared controller.
func TestOpenRefusesAGzipBomb(t *testing.T) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zeros := make([]byte, 1<<20)
	for i := 0; i <= MaxOpenedBytes>>20; i++ {
		if _, err := zw.Write(zeros); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 1<<20 {
		t.Fatalf("the bomb is %d bytes compressed; want a small one", buf.Len())
	}
	_, err := Open(buf.Bytes(), EncodingGzip, nil, "state")
	var corrupt *CorruptError
	if !errors.As(err, &corrupt) {
		t.Fatalf("Open of a %d-byte bomb returned %v, want a CorruptError", buf.Len(), err)
	}
}
