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
// the counts, each at least 1. TERRACE_CHAOS_SPREAD (default longSpread)
// is how many workloads share each runner fault. TERRACE_CHAOS_INJECT_FOR
// (a duration from the start) stops injecting after it: the table then
// counts what was injected. TERRACE_CHAOS_FAULTS names the faults to run
// (selectFaults).
func TestChaosLong(t *testing.T) {
	spread := longSpread
	if s := os.Getenv("TERRACE_CHAOS_SPREAD"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("TERRACE_CHAOS_SPREAD=%q is not a positive integer", s)
		}
		spread = v
	}
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
	var injectFor time.Duration
	if s := os.Getenv("TERRACE_CHAOS_INJECT_FOR"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("TERRACE_CHAOS_INJECT_FOR=%q is not a duration", s)
		}
		injectFor = d
	}
	lifecycles := max(1, int(math.Round(5*scale)))
	if !selectFaults(t, counts) {
		lifecycles = 0
	}
	runChaos(t, plan{counts: counts, lifecycles: lifecycles, rotateEvery: 10 * time.Second, spread: spread, injectFor: injectFor})
}

// longSpread workloads share each runner fault's injections: 20 kills one
// after the other on one Stack took most of the long run's time, each a
// run or two; side by side, four at a time, they take a quarter of it.
const longSpread = 4
