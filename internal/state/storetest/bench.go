package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
)

// BenchmarkSizes are the state sizes the put/get benchmarks measure.
var BenchmarkSizes = []struct {
	Name string
	Size int
}{{"10KiB", 10 << 10}, {"1MiB", 1 << 20}, {"10MiB", 10 << 20}}

// RunBenchmarks measures Put and Get latency by state size. The states are
// padded with random text, which compresses far worse than real state JSON:
// the figures are a worst case.
func RunBenchmarks(b *testing.B, store state.Store, namespace string) {
	ctx := context.Background()
	for _, size := range BenchmarkSizes {
		key := state.Key{Namespace: namespace, Stack: "bench-" + size.Name, Workspace: "default"}
		states := make([][]byte, 4)
		for i := range states {
			states[i] = StateJSON("bench", 1, i, size.Size)
		}
		var serial int64
		put := func(b *testing.B) {
			serial++
			data := states[serial%int64(len(states))]
			// Serial must grow: rewrite it in place of the seeded 1.
			data = withSerial(data, serial)
			if _, err := store.Put(ctx, key, data, state.PutOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("Put/%s", size.Name), func(b *testing.B) {
			b.SetBytes(int64(size.Size))
			for b.Loop() {
				put(b)
			}
		})
		b.Run(fmt.Sprintf("Get/%s", size.Name), func(b *testing.B) {
			if serial == 0 {
				put(b)
			}
			b.SetBytes(int64(size.Size))
			for b.Loop() {
				if _, err := store.Get(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func withSerial(data []byte, serial int64) []byte {
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		panic(err)
	}
	doc["serial"] = serial
	out, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return out
}
