package runphase

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// phaseSeconds is terrace_run_phase_seconds: where runs spend their time.
// Its labels are bounded: the seven phases and the run kinds.
var phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "terrace_run_phase_seconds",
	Help:    "Duration of each phase of a run (pod, fetch, init, plan, apply, outputs, records), by run kind.",
	Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
}, []string{"phase", "kind"})

func init() { metrics.Registry.MustRegister(phaseSeconds) }

// Observe records every phase of t in terrace_run_phase_seconds under the
// run's kind (plan, apply, drift, destroy).
func (t *Timings) Observe(kind string) {
	t.Each(func(p Phase, d time.Duration) { phaseSeconds.WithLabelValues(string(p), kind).Observe(d.Seconds()) })
}
