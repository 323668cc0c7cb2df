//go:build chaos

package chaos

import (
	"math"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestChaosLong injects each fault as often as issue 16 asks; `make chaos`
// runs it (build tag chaos, so `go test ./...` never compiles it in). TERRACE_CHAOS_SCALE (default 1) multiplies
// the counts, each at least 1.
func TestChaosLong(t *testing.T) {
	scale := 1.0
	if s := os.Getenv("TERRACE_CHAOS_SCALE"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			t.Fatalf("TERRACE_CHAOS_SCALE=%q is not a positive number", s)
		}
		scale = v
	}
	counts := map[string]int{}
	for f, n := range issueCounts {
		counts[f] = max(1, int(math.Round(float64(n)*scale)))
	}
	runChaos(t, plan{counts: counts, lifecycles: max(1, int(math.Round(5*scale))), rotateEvery: 10 * time.Second})
}
