package e2e

import (
	"testing"
	"time"
)

// The benchmark's split of a lone run adds the runner's tofu operations
// from its log, leaves the module's fetch or upload out and reads past a
// duration it cannot read.
func TestRunnerTofuTimeAddsTheTofuOperations(t *testing.T) {
	lines := []string{
		`runner "ts"="2026-12-04 03:47:58.363053" "level"=0 "msg"="serving" "address"="127.76.237.2:9090" "warm"=true`,
		`runner "ts"="2026-12-04 03:47:58.515761" "level"=0 "msg"="operation finished" "op"="fetch" "phase"="fetch" "duration"="6ms"`,
		`runner "ts"="2026-12-04 03:47:58.516201" "level"=0 "msg"="operation finished" "op"="upload" "phase"="fetch" "duration"="2ms"`,
		`runner "ts"="2026-12-04 03:47:58.517029" "level"=0 "msg"="operation started" "op"="init" "phase"="init"`,
		`runner "ts"="2026-12-04 03:47:58.630459" "level"=0 "msg"="operation finished" "op"="init" "phase"="init" "duration"="113ms"`,
		`runner "ts"="2026-12-04 03:47:58.754551" "level"=0 "msg"="phase finished" "phase"="plan" "duration"="123ms" "failed"=false`,
		`runner "ts"="2026-12-04 03:47:58.773125" "level"=0 "msg"="operation finished" "op"="plan-and-apply" "duration"="141ms"`,
		`runner "ts"="2026-12-04 03:47:58.790000" "level"=0 "msg"="operation finished" "op"="output" "duration"="?"`, // a duration it cannot read
	}
	got, ok := runnerTofuTime(lines)
	if !ok || got != 254*time.Millisecond {
		t.Fatalf("runnerTofuTime = %v, %v; want 254ms (init 113 + plan-and-apply 141)", got, ok)
	}
	if _, ok := runnerTofuTime(lines[:3]); ok {
		t.Fatal("a log with only the module's fetch and upload reported a tofu time")
	}
}
