package state_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// BenchmarkSealFor seals states of the sizes most writes carry (the
// benchmark Stack's state is under 1 KiB) and a larger one.
func BenchmarkSealFor(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		plain := storetest.StateJSON("lineage", 1, 0, size)
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(plain)))
			for b.Loop() {
				if _, _, err := state.SealFor(plain, nil, state.Binding{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGzip compares state.Gzip's reused writers with a new writer for
// each call (what SealFor and release records did), in one run.
func BenchmarkGzip(b *testing.B) {
	plain := storetest.StateJSON("lineage", 1, 0, 1<<10)
	b.Run("new-writer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var buf bytes.Buffer
			zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := zw.Write(plain); err != nil {
				b.Fatal(err)
			}
			if err := zw.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reused-writer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := state.Gzip(plain, gzip.BestSpeed); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkOpenFor opens a sealed 1 KiB state.
func BenchmarkOpenFor(b *testing.B) {
	sealed, encoding, err := state.SealFor(storetest.StateJSON("lineage", 1, 0, 1<<10), nil, state.Binding{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := state.OpenFor(sealed, encoding, nil, state.Binding{}, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
