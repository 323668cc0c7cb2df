package state

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"sync"
)

// gzipWriters keeps gzip writers for reuse, one pool per level. A new
// writer allocates and clears about 1.2 MB of compressor state, which for
// the small states and release records most writes carry costs a hundred
// times more than compressing them (BenchmarkSealFor).
var gzipWriters [gzip.BestCompression - gzip.HuffmanOnly + 1]sync.Pool

// Gzip compresses plain at level (a compress/gzip level) with a reused writer.
func Gzip(plain []byte, level int) ([]byte, error) {
	if level < gzip.HuffmanOnly || level > gzip.BestCompression {
		return nil, fmt.Errorf("invalid gzip level %d", level)
	}
	pool := &gzipWriters[level-gzip.HuffmanOnly]
	var buf bytes.Buffer
	buf.Grow(len(plain)/4 + 64)
	zw, _ := pool.Get().(*gzip.Writer)
	if zw == nil {
		var err error
		if zw, err = gzip.NewWriterLevel(&buf, level); err != nil {
			return nil, fmt.Errorf("failed to start gzip: %w", err)
		}
	} else {
		zw.Reset(&buf)
	}
	if _, err := zw.Write(plain); err != nil {
		return nil, fmt.Errorf("failed to compress: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("failed to compress: %w", err)
	}
	// Only a writer that finished cleanly goes back, holding no buffer.
	zw.Reset(io.Discard)
	pool.Put(zw)
	return buf.Bytes(), nil
}
