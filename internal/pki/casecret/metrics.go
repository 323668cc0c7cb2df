package casecret

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/terrace-dev/terrace/internal/pki"
)

// caExpiry lets an alert fire before the CA expires: rotation should have
// replaced it long before (config/monitoring/prometheusrule.yaml).
var caExpiry = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "terrace_ca_expiry_timestamp_seconds",
	Help: "When the current CA certificate, which signs every run's certificates, expires (Unix seconds).",
})

func init() { metrics.Registry.MustRegister(caExpiry) }

func recordCAExpiry(ca *pki.CA) {
	if ca != nil {
		caExpiry.Set(float64(ca.Certificate().NotAfter.Unix()))
	}
}
