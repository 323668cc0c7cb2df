package stack

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/terrace-dev/terrace/internal/runphase"
)

func TestObserveFillsThePhaseHistogram(t *testing.T) {
	var tm runphase.Timings
	tm.Add(runphase.Init, 150*time.Millisecond)
	tm.Add(runphase.Outputs, 0)
	observePhases(&tm, "destroy")
	for phase, wantSum := range map[runphase.Phase]float64{runphase.Init: 0.15, runphase.Outputs: 0} {
		var m dto.Metric
		if err := phaseSeconds.WithLabelValues(string(phase), "destroy").(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		h := m.GetHistogram()
		if h.GetSampleCount() != 1 || h.GetSampleSum() != wantSum {
			t.Errorf("%s: count %d sum %g, want 1 and %g", phase, h.GetSampleCount(), h.GetSampleSum(), wantSum)
		}
	}
	var m dto.Metric
	if err := phaseSeconds.WithLabelValues(string(runphase.Apply), "destroy").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.GetHistogram().GetSampleCount() != 0 {
		t.Error("an unrecorded phase was observed")
	}
}
