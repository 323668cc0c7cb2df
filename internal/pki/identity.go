// Package pki holds Terrace's certificate authority: the identities carried
// in certificates, issuance of short-lived leaves, TLS configurations that
// check the peer's identity. It links no Kubernetes client, because the
// runner links it; the CA's Secret and its rotation are internal/pki/casecret.
package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
)

// namePart is what a namespace, stack name or run ID may look like: a
// Kubernetes DNS subdomain, so identities need no escaping in a URI.
var namePart = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// Identity names a party of Terrace. It is carried as the single URI SAN
// of a leaf certificate, e.g. terrace://controller or
// terrace://runner/{namespace}/{stack}/{runID}.
type Identity string

const (
	identityScheme = "terrace"
	runnerHost     = "runner"
	apiHost        = "api"

	// ControllerIdentity is the identity of every controller replica.
	ControllerIdentity Identity = identityScheme + "://controller"
)

// RunnerIdentity is the identity of one run's runner pod.
func RunnerIdentity(namespace, stack, runID string) Identity {
	return Identity(identityScheme + "://" + runnerHost + "/" + namespace + "/" + stack + "/" + runID)
}

// classSegment marks a warm runner's identity, which names its runner
// class and pod instead of a Stack and run.
const classSegment = "class"

// RunnerClassIdentity is the identity of a warm runner pod, started before
// its Stack is known: terrace://runner/{namespace}/class/{class}/{pod}.
// It names no Stack, so no server accepts it for a Stack's state or a
// Program; the run's own identity is handed to the pod when a run claims it.
func RunnerClassIdentity(namespace, class, pod string) Identity {
	return Identity(identityScheme + "://" + runnerHost + "/" + namespace + "/" + classSegment + "/" + class + "/" + pod)
}

// RunnerClass splits a warm runner's identity; ok is false for any other identity.
func (id Identity) RunnerClass() (namespace, class, pod string, ok bool) {
	rest, found := strings.CutPrefix(string(id), identityScheme+"://"+runnerHost+"/")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || parts[1] != classSegment {
		return "", "", "", false
	}
	for _, p := range []string{parts[0], parts[2], parts[3]} {
		if len(p) > 253 || !namePart.MatchString(p) {
			return "", "", "", false
		}
	}
	return parts[0], parts[2], parts[3], true
}

// APIIdentity is the identity of a namespace's Installations API server. It
// serves HTTPS to tools; no Terrace server accepts it as a client.
func APIIdentity(namespace string) Identity {
	return Identity(identityScheme + "://" + apiHost + "/" + namespace)
}

// API returns the namespace of an API server identity; ok is false for any other identity.
func (id Identity) API() (namespace string, ok bool) {
	ns, found := strings.CutPrefix(string(id), identityScheme+"://"+apiHost+"/")
	if !found || len(ns) > 63 || !namePart.MatchString(ns) || strings.Contains(ns, ".") {
		return "", false
	}
	return ns, true
}

// Runner splits a runner identity into its parts; ok is false for any other identity.
func (id Identity) Runner() (namespace, stack, runID string, ok bool) {
	rest, found := strings.CutPrefix(string(id), identityScheme+"://"+runnerHost+"/")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", "", false
	}
	for _, p := range parts {
		if len(p) > 253 || !namePart.MatchString(p) {
			return "", "", "", false
		}
	}
	return parts[0], parts[1], parts[2], true
}

// readOnlySegment ends the identity of a read-only run.
const readOnlySegment = "read-only"

// ReadOnlyRunnerIdentity is the identity of a plan-only run of a pull
// request: terrace://runner/{namespace}/{stack}/{runID}/read-only. It names
// the Stack, but Runner refuses it, so no server that checks Runner accepts
// it; the state server lets it read that Stack's state and nothing else
// (no write, lock, unlock or delete), while the run is current.
func ReadOnlyRunnerIdentity(namespace, stack, runID string) Identity {
	return RunnerIdentity(namespace, stack, runID) + "/" + readOnlySegment
}

// ReadOnlyRunner splits a read-only run's identity; ok is false for any
// other identity, a run's own included.
func (id Identity) ReadOnlyRunner() (namespace, stack, runID string, ok bool) {
	run, found := strings.CutSuffix(string(id), "/"+readOnlySegment)
	if !found {
		return "", "", "", false
	}
	return Identity(run).Runner()
}

// Validate reports whether id is one of the identities Terrace issues.
func (id Identity) Validate() error {
	if id == ControllerIdentity {
		return nil
	}
	if _, _, _, ok := id.Runner(); ok {
		return nil
	}
	if _, ok := id.API(); ok {
		return nil
	}
	if _, _, _, ok := id.RunnerClass(); ok {
		return nil
	}
	if _, _, _, ok := id.ReadOnlyRunner(); ok {
		return nil
	}
	return fmt.Errorf("%q is not a terrace identity (want %s, %s, %s, %s or %s)", string(id), ControllerIdentity, RunnerIdentity("{namespace}", "{stack}", "{runID}"),
		ReadOnlyRunnerIdentity("{namespace}", "{stack}", "{runID}"), RunnerClassIdentity("{namespace}", "{class}", "{pod}"), APIIdentity("{namespace}"))
}

func (id Identity) String() string { return string(id) }

// url returns the identity as the URL placed in a certificate.
func (id Identity) url() (*url.URL, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	u, err := url.Parse(string(id))
	if err != nil {
		return nil, fmt.Errorf("failed to parse identity %q: %w", string(id), err)
	}
	return u, nil
}

// IdentityFromCertificate returns the identity a certificate carries: it
// must have exactly one terrace:// URI SAN, and that must be a valid identity.
func IdentityFromCertificate(c *x509.Certificate) (Identity, error) {
	if c == nil {
		return "", errors.New("no certificate")
	}
	var found []Identity
	for _, u := range c.URIs {
		if u.Scheme == identityScheme {
			found = append(found, Identity(u.String()))
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("certificate %q carries no terrace identity", c.Subject.CommonName)
	case 1:
	default:
		return "", fmt.Errorf("certificate %q carries %d terrace identities, want one", c.Subject.CommonName, len(found))
	}
	if err := found[0].Validate(); err != nil {
		return "", err
	}
	return found[0], nil
}

// podURIPrefix starts the URI SAN that binds a leaf to a pod's UID (an RFC
// 4122 URN: Kubernetes UIDs are UUIDs).
const podURIPrefix = "urn:uuid:"

// podUIDPart is what a pod UID may look like in a certificate.
var podUIDPart = regexp.MustCompile(`^[0-9a-f]([-0-9a-f]{0,62}[0-9a-f])?$`)

// podURI is the URI SAN of a leaf bound to the pod with uid.
func podURI(uid string) (*url.URL, error) {
	if !podUIDPart.MatchString(uid) {
		return nil, fmt.Errorf("%q is not a pod UID", uid)
	}
	return url.Parse(podURIPrefix + uid)
}

// PodUIDFromCertificate returns the UID of the pod a leaf is bound to
// (LeafRequest.PodUID), or "" when it is bound to none. A leaf carries at
// most one: with more, it is bound to none that could be trusted, and ""
// is returned.
func PodUIDFromCertificate(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	var found []string
	for _, u := range c.URIs {
		if uid, ok := strings.CutPrefix(u.String(), podURIPrefix); ok && podUIDPart.MatchString(uid) {
			found = append(found, uid)
		}
	}
	if len(found) != 1 {
		return ""
	}
	return found[0]
}

// PeerPodUID returns the pod UID the peer's verified leaf is bound to, ""
// for none (see PeerIdentity).
func PeerPodUID(cs *tls.ConnectionState) string {
	if cs == nil || !cs.HandshakeComplete {
		return ""
	}
	if len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 {
		return PodUIDFromCertificate(cs.VerifiedChains[0][0])
	}
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return PodUIDFromCertificate(cs.PeerCertificates[0])
}

// PodUIDFromRequest returns the pod UID of an HTTP client's certificate,
// for a handler served with ServerTLSConfig ("" for none).
func PodUIDFromRequest(r *http.Request) string {
	if r.TLS == nil {
		return ""
	}
	return PeerPodUID(r.TLS)
}

// PeerIdentity returns the identity of the peer of a connection established
// with ServerTLSConfig or ClientTLSConfig: those refuse the handshake unless
// the peer's leaf chains to a trusted CA and its identity is accepted, so the
// leaf read here has been verified.
func PeerIdentity(cs *tls.ConnectionState) (Identity, error) {
	if cs == nil || !cs.HandshakeComplete {
		return "", errors.New("no completed TLS handshake")
	}
	if len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 {
		return IdentityFromCertificate(cs.VerifiedChains[0][0])
	}
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("peer presented no certificate")
	}
	return IdentityFromCertificate(cs.PeerCertificates[0])
}

// IdentityFromRequest returns the client's identity for an HTTP handler
// served with ServerTLSConfig.
func IdentityFromRequest(r *http.Request) (Identity, error) {
	if r.TLS == nil {
		return "", errors.New("request did not arrive over TLS")
	}
	return PeerIdentity(r.TLS)
}
