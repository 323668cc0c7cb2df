package artifactserver

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "terrace_artifact_requests_total",
		Help: "Requests to the artifact server, by HTTP status code.",
	}, []string{"code"})
	bytesServed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "terrace_artifact_bytes_served_total",
		Help: "Artifact bytes sent in response bodies.",
	})
	buildDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "terrace_artifact_build_duration_seconds",
		Help:    "Time to build a Program's tarball.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
)

func init() {
	metrics.Registry.MustRegister(requestsTotal, bytesServed, buildDuration)
}

// countRequest records one answer; codes are bounded by the handler.
func countRequest(code int) {
	requestsTotal.WithLabelValues(strconv.Itoa(code)).Inc()
}
