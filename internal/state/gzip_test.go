package state_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// Reused writers start each stream afresh: every output, from goroutines
// sharing the pool, inflates to its own input and nothing of another's.
func TestGzipReusedWritersKeepStreamsApart(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				plain := storetest.StateJSON("lineage", int64(g*100+i), i, 10+i*997)
				for _, level := range []int{gzip.BestSpeed, gzip.DefaultCompression} {
					out, err := state.Gzip(plain, level)
					if err != nil {
						t.Error(err)
						return
					}
					zr, err := gzip.NewReader(bytes.NewReader(out))
					if err != nil {
						t.Error(err)
						return
					}
					got, err := io.ReadAll(zr)
					if err != nil || !bytes.Equal(got, plain) {
						t.Errorf("stream %d/%d at level %d inflates to %d bytes, want its own %d: %v", g, i, level, len(got), len(plain), err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

func TestGzipRefusesAnUnknownLevel(t *testing.T) {
	if _, err := state.Gzip([]byte("x"), 42); err == nil || !strings.Contains(err.Error(), "level 42") {
		t.Fatalf("level 42: %v", err)
	}
}
