package httpbackend

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "terrace_state_requests_total",
		Help: "Requests to the Terraform state server by method and response code.",
	}, []string{"method", "code"})
	requestSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "terrace_state_request_duration_seconds",
		Help:    "Time to answer a state server request, by method.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"method"})
	inflightBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "terrace_state_inflight_bytes",
		Help: "Bytes of large states the state server holds admitted right now (see --state-server-max-inflight-bytes).",
	})
	inflightSmallBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "terrace_state_inflight_small_bytes",
		Help: "Bytes of small states and lock infos (up to 1 MiB each) the state server holds right now (see --state-server-max-small-inflight-bytes).",
	})
	openConnections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "terrace_state_connections",
		Help: "Connections the state server has open (see --state-server-max-connections).",
	})
)

func init() {
	metrics.Registry.MustRegister(requestsTotal, requestSeconds, inflightBytes, inflightSmallBytes, openConnections)
}

// observe records one request; methods outside the protocol count as "other"
// so the label set stays bounded.
func observe(method string, code int, took time.Duration) {
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, MethodLock, MethodUnlock:
	default:
		method = "other"
	}
	requestsTotal.WithLabelValues(method, strconv.Itoa(code)).Inc()
	requestSeconds.WithLabelValues(method).Observe(took.Seconds())
}
