// Package runphase names the phases of a run once, for the logs, events,
// metrics and benchmarks that say where a run's time went, and records how
// long each took.
package runphase

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// Phase is one step of a run, in the order a run goes through them.
type Phase string

const (
	// Pod is starting the runner pod until the runner answers over mutual TLS.
	Pod Phase = "pod"
	// Fetch is getting the module source into the runner.
	Fetch Phase = "fetch"
	// Init is `init`.
	Init Phase = "init"
	// Plan is `plan` and reading the plan back.
	Plan Phase = "plan"
	// Apply is `apply` of the plan.
	Apply Phase = "apply"
	// Outputs is reading the root outputs and writing them where the Stack asks.
	Outputs Phase = "outputs"
	// Records is storing what the run leaves: plan, release, status.
	Records Phase = "records"
)

// All are the phases in run order.
var All = []Phase{Pod, Fetch, Init, Plan, Apply, Outputs, Records}

// Timings are the durations of one run's phases. The zero value is ready;
// it is safe for concurrent use. A phase timed twice (a retried step)
// adds up.
type Timings struct {
	mu sync.Mutex
	d  map[Phase]time.Duration
}

// Add records d for phase p.
func (t *Timings) Add(p Phase, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.d == nil {
		t.d = map[Phase]time.Duration{}
	}
	t.d[p] += d
}

// Start starts timing p; the returned func records the time since. Use it
// as `defer timings.Start(runphase.Init)()` or call it when the phase ends.
func (t *Timings) Start(p Phase) func() {
	start := time.Now()
	var once sync.Once
	return func() { once.Do(func() { t.Add(p, time.Since(start)) }) }
}

// Get is the time recorded for p, and whether p was recorded at all.
func (t *Timings) Get(p Phase) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.d[p]
	return d, ok
}

// Each calls f for every recorded phase, in run order.
func (t *Timings) Each(f func(Phase, time.Duration)) {
	t.mu.Lock()
	recorded := make(map[Phase]time.Duration, len(t.d))
	for p, d := range t.d {
		recorded[p] = d
	}
	t.mu.Unlock()
	for _, p := range All {
		if d, ok := recorded[p]; ok {
			f(p, d)
		}
	}
}

// Total is the sum of the recorded phases.
func (t *Timings) Total() time.Duration {
	var sum time.Duration
	t.Each(func(_ Phase, d time.Duration) { sum += d })
	return sum
}

// String lists the recorded phases in run order, for an event or a log
// line: "pod 0.41s, fetch 0.02s, init 0.15s, plan 0.24s".
func (t *Timings) String() string {
	var parts []string
	t.Each(func(p Phase, d time.Duration) { parts = append(parts, fmt.Sprintf("%s %s", p, seconds(d))) })
	return strings.Join(parts, ", ")
}

// KeysAndValues are the phases as logr key/value pairs, "pod", "0.41s", ...
func (t *Timings) KeysAndValues() []any {
	var kv []any
	t.Each(func(p Phase, d time.Duration) { kv = append(kv, string(p), seconds(d)) })
	return kv
}

func seconds(d time.Duration) string {
	return fmt.Sprintf("%.2fs", d.Seconds())
}
