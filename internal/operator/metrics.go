package operator

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/terrace-dev/terrace/internal/pki"
)

// The metrics name every tenant's namespaces and Stacks, so they are served
// over HTTPS and only to a caller the Kubernetes API authenticates (a
// TokenReview of its bearer token) and authorizes for GET on the
// non-resource URL /metrics (a SubjectAccessReview): the ClusterRole
// terrace-metrics-reader (config/rbac/metrics_reader_role.yaml) grants
// that, bound to Prometheus's ServiceAccount. The filter's reviews are
// cluster-scoped, so they go into the ClusterRole that is always bound
// cluster-wide (ClusterScopeRole, rbac.go):
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create,roleName=terrace-controller-cluster
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create,roleName=terrace-controller-cluster

// MetricsReaderRole is the ClusterRole whose binding lets a scraper read
// the controller's metrics.
const MetricsReaderRole = "terrace-metrics-reader"

// metricsServerOptions serve the controller's metrics on addr ("0": none).
// With secure (the default) they are served over HTTPS with cert (the
// controller's serving certificate from its CA, so a scraper can verify it
// by the name terrace-controller.<namespace>.svc) and only to authorized
// callers; without, over plain HTTP to anyone, for a controller run by hand
// outside a cluster on a loopback address.
func metricsServerOptions(addr string, secure bool, cert pki.CertificateSource) metricsserver.Options {
	if !secure {
		return metricsserver.Options{BindAddress: addr}
	}
	return metricsserver.Options{
		BindAddress:    addr,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			c.MinVersion = tls.VersionTLS12
			// HTTP/2 off: a scrape needs nothing of it, and it keeps the
			// server out of HTTP/2's rapid-reset class of attacks.
			c.NextProtos = []string{"http/1.1"}
			c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Certificate() }
		}},
	}
}
