package e2e

import (
	"fmt"
	"testing"

	dto "github.com/prometheus/client_model/go"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// metricValue reads a counter or gauge the in-process controller exports
// (the registry its /metrics endpoint serves) for the series with labels.
func metricValue(t testing.TB, name string, labels map[string]string) (float64, error) {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue(), nil
				case m.Gauge != nil:
					return m.Gauge.GetValue(), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no series %s%v", name, labels)
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			found++
		}
	}
	return found == len(want)
}
