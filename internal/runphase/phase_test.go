package runphase

import (
	"testing"
	"time"
)

func TestTimingsListPhasesInRunOrder(t *testing.T) {
	var tm Timings
	tm.Add(Apply, 250*time.Millisecond)
	tm.Add(Pod, 410*time.Millisecond)
	tm.Add(Plan, 100*time.Millisecond)
	tm.Add(Plan, 140*time.Millisecond) // a second plan adds up
	if got, want := tm.String(), "pod 0.41s, plan 0.24s, apply 0.25s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if d, ok := tm.Get(Fetch); ok || d != 0 {
		t.Errorf("Get(fetch) = %s, %v; want unrecorded", d, ok)
	}
	if got := tm.Total(); got != 900*time.Millisecond {
		t.Errorf("Total() = %s", got)
	}
	kv := tm.KeysAndValues()
	if len(kv) != 6 || kv[0] != "pod" || kv[1] != "0.41s" {
		t.Errorf("KeysAndValues() = %v", kv)
	}
	done := tm.Start(Records)
	done()
	done() // once
	if _, ok := tm.Get(Records); !ok {
		t.Error("Start's func recorded nothing")
	}
}
