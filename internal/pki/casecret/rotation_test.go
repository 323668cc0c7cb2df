package casecret

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/pki/pkitest"
)

const day = 24 * time.Hour

var caSecretKey = types.NamespacedName{Namespace: "terrace-system", Name: "terrace-ca"}

func newFakeStore(opts ...func(*fake.ClientBuilder)) *Store {
	b := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme)
	for _, o := range opts {
		o(b)
	}
	return &Store{Client: b.Build(), Key: caSecretKey}
}

// issuerOf returns the CA (of those given) that signed a leaf.
func issuerOf(t *testing.T, leaf *pki.Leaf, cas ...*pki.CA) *pki.CA {
	t.Helper()
	c, err := leaf.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	for _, ca := range cas {
		if c.CheckSignatureFrom(ca.Certificate()) == nil {
			return ca
		}
	}
	t.Fatal("leaf signed by none of the CAs")
	return nil
}

func leafTrust(t *testing.T, l *pki.Leaf) pki.TrustSource {
	t.Helper()
	pool, err := l.TrustPool()
	if err != nil {
		t.Fatal(err)
	}
	return pki.TrustFunc(func() *x509.CertPool { return pool })
}

func tlsCert(t *testing.T, l *pki.Leaf) tls.Certificate {
	t.Helper()
	c, err := l.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testRunner is a run's runner identity.
var testRunner = pki.RunnerIdentity("team-a", "network", "run-1")

// runnerServer is a runner's gRPC side: it accepts only the controller.
func runnerServer(cert tls.Certificate, trust pki.TrustSource) *tls.Config {
	return pki.ServerTLSConfig(pki.StaticCertificate(cert), trust, pki.RequireIdentity(pki.ControllerIdentity))
}

// controllerClient is the controller dialling one run's runner.
func controllerClient(cert *tls.Certificate, trust pki.TrustSource, runner pki.Identity) *tls.Config {
	return pki.ClientTLSConfig(pki.StaticCertificate(*cert), trust, runner)
}

// mustLoad is s.LoadOrCreate for a test that expects it to succeed.
func mustLoad(t *testing.T, s *Store, opts pki.Options) *pki.Authority {
	t.Helper()
	a, err := s.LoadOrCreate(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func issue(t *testing.T, a *pki.Authority, id pki.Identity, validity time.Duration) *pki.Leaf {
	t.Helper()
	l, err := a.Issue(pki.LeafRequest{Identity: id, Validity: validity})
	if err != nil {
		t.Fatalf("failed to issue %s: %v", id, err)
	}
	return l
}

// TestRotationOverlap walks a CA through its life with real handshakes at
// each step: rotation when a third of its life is left, old and new leaves
// working together during the overlap, the old CA dropped once expired.
func TestRotationOverlap(t *testing.T) {
	ctx := context.Background()
	clock := pkitest.NewClock(time.Now())
	at := func(cfg *tls.Config) *tls.Config { cfg.Time = clock.Now; return cfg }
	s := newFakeStore()
	a := mustLoad(t, s, pki.Options{Clock: clock.Now})
	ca1, _ := a.CAs()

	clock.Advance(200 * day) // 165 of 365 days left: not yet
	if rotated, err := s.RotateIfDue(ctx, a, DefaultRotateWhenRemaining); err != nil || rotated {
		t.Fatalf("rotated=%v err=%v with more than a third of the lifetime left", rotated, err)
	}

	clock.Advance(50 * day) // 115 days left
	// A run started just before the rotation knows only CA1.
	runnerBefore := issue(t, a, testRunner, 12*time.Hour)
	if rotated, err := s.RotateIfDue(ctx, a, DefaultRotateWhenRemaining); err != nil || !rotated {
		t.Fatalf("rotated=%v err=%v with less than a third of the lifetime left", rotated, err)
	}
	ca2, previous := a.CAs()
	if ca2.Equal(ca1) || !previous.Equal(ca1) {
		t.Fatal("after rotation the new CA must be current and the old one previous")
	}
	if n := len(mustParseBundle(t, a.CABundlePEM())); n != 2 {
		t.Fatalf("bundle holds %d CAs during the overlap, want 2", n)
	}

	// Until the new CA is activated the controller still gets CA1 leaves, so
	// the run that only knows CA1 keeps talking to it.
	clock.Advance(time.Hour)
	controllerEarly := issue(t, a, pki.ControllerIdentity, 24*time.Hour)
	if issuerOf(t, controllerEarly, ca1, ca2) != ca1 {
		t.Fatal("the new CA issued before its activation delay")
	}
	res := pkitest.Connect(t,
		at(runnerServer(tlsCert(t, runnerBefore), leafTrust(t, runnerBefore))),
		at(controllerClient(ptr(tlsCert(t, controllerEarly)), a, testRunner)))
	if !res.OK() {
		t.Fatalf("run started before rotation: server %v, client %v", res.ServerErr, res.ClientErr)
	}
	clock.Advance(19 * time.Hour)
	controllerOld := issue(t, a, pki.ControllerIdentity, 24*time.Hour)
	if issuerOf(t, controllerOld, ca1, ca2) != ca1 {
		t.Fatal("the new CA issued before its activation delay")
	}

	// After activation new leaves come from CA2; leaves from both CAs work together.
	clock.Advance(pki.DefaultActivationDelay - 20*time.Hour + time.Minute)
	runnerNew := issue(t, a, testRunner, 12*time.Hour)
	controllerNew := issue(t, a, pki.ControllerIdentity, 12*time.Hour)
	if issuerOf(t, runnerNew, ca1, ca2) != ca2 || issuerOf(t, controllerNew, ca1, ca2) != ca2 {
		t.Fatal("the new CA is not issuing after its activation delay")
	}
	for _, pair := range []struct {
		name               string
		runner, controller *pki.Leaf
	}{
		{"new runner, old controller", runnerNew, controllerOld},
		{"new runner, new controller", runnerNew, controllerNew},
	} {
		res := pkitest.Connect(t,
			at(runnerServer(tlsCert(t, pair.runner), leafTrust(t, pair.runner))),
			at(controllerClient(ptr(tlsCert(t, pair.controller)), a, testRunner)))
		if !res.OK() {
			t.Fatalf("%s: server %v, client %v", pair.name, res.ServerErr, res.ClientErr)
		}
	}
	// An old-CA leaf on the controller side serving a runner that dials it (the state server).
	stateServer := at(pki.ServerTLSConfig(pki.StaticCertificate(tlsCert(t, controllerOld)), a, nil))
	res = pkitest.Connect(t, stateServer, at(pki.ClientTLSConfig(pki.StaticCertificate(tlsCert(t, runnerNew)), leafTrust(t, runnerNew), pki.ControllerIdentity)))
	if !res.OK() {
		t.Fatalf("old controller leaf serving a new runner: server %v, client %v", res.ServerErr, res.ClientErr)
	}

	// Once CA1 expires it is no longer trusted or handed out.
	clock.Advance(ca1.Certificate().NotAfter.Sub(clock.Now()) + time.Minute)
	if bundle := mustParseBundle(t, a.CABundlePEM()); len(bundle) != 1 || !bundle[0].Equal(ca2.Certificate()) {
		t.Fatalf("bundle after CA1 expired holds %d CAs, want only CA2", len(bundle))
	}
	leafFromCA1 := issueWith(t, ca1, pki.ControllerIdentity, ca1.Certificate().NotAfter.Add(-time.Hour))
	if _, err := leafFromCA1.Verify(x509.VerifyOptions{Roots: a.TrustPool(), CurrentTime: ca1.Certificate().NotAfter.Add(-30 * time.Minute)}); err == nil {
		t.Fatal("CA1 is still in the trust pool after it expired")
	}

	// The next rotation drops CA1 from the Secret.
	clock.Advance(ca2.Certificate().NotAfter.Sub(clock.Now()) - 100*day)
	if rotated, err := s.RotateIfDue(ctx, a, DefaultRotateWhenRemaining); err != nil || !rotated {
		t.Fatalf("second rotation: rotated=%v err=%v", rotated, err)
	}
	reloaded := mustLoad(t, s, pki.Options{Clock: clock.Now})
	cur, prev := reloaded.CAs()
	if !prev.Equal(ca2) || cur.Equal(ca2) || cur.Equal(ca1) {
		t.Fatal("the Secret after the second rotation must hold a third CA and CA2")
	}
}

func ptr[T any](v T) *T { return &v }

func mustParseBundle(t *testing.T, pemData []byte) []*x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	for block, rest := pem.Decode(pemData); block != nil; block, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, c)
	}
	return certs
}

// issueWith signs a leaf directly with ca, valid around at.
func issueWith(t *testing.T, ca *pki.CA, id pki.Identity, at time.Time) *x509.Certificate {
	t.Helper()
	a, err := pki.NewAuthorityFromCAs(pki.Options{Clock: func() time.Time { return at }}, ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := issue(t, a, id, time.Hour).Certificate()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRotationThresholdChecked(t *testing.T) {
	s := newFakeStore()
	a := mustLoad(t, s, pki.Options{})
	for _, fraction := range []float64{0, 0.6, 0.001} {
		if _, err := s.RotateIfDue(context.Background(), a, fraction); err == nil {
			t.Errorf("fraction %v accepted", fraction)
		}
	}
}

// TestRotationAdoptsRivalWrite: when another writer rotates between our read
// and our write, the compare-and-swap fails and its CA is adopted.
func TestRotationAdoptsRivalWrite(t *testing.T) {
	ctx := context.Background()
	clock := pkitest.NewClock(time.Now())
	s := newFakeStore()
	a := mustLoad(t, s, pki.Options{Clock: clock.Now})
	rival := mustLoad(t, s, pki.Options{Clock: clock.Now})
	clock.Advance(300 * day)

	// Wrap the client so the rival rotates just before our update lands.
	var once sync.Once
	s.Client = interceptUpdate(s.Client, func() {
		once.Do(func() {
			rivalSecret := &Store{Client: s.Client.(*updateInterceptor).Client, Key: caSecretKey}
			if rotated, err := rivalSecret.RotateIfDue(ctx, rival, DefaultRotateWhenRemaining); err != nil || !rotated {
				t.Errorf("rival rotation: rotated=%v err=%v", rotated, err)
			}
		})
	})
	rotated, err := s.RotateIfDue(ctx, a, DefaultRotateWhenRemaining)
	if err != nil {
		t.Fatal(err)
	}
	if rotated {
		t.Fatal("rotated a second time instead of adopting the rival's CA")
	}
	ours, _ := a.CAs()
	theirs, _ := rival.CAs()
	if !ours.Equal(theirs) {
		t.Fatal("did not adopt the rival's CA")
	}
}

// updateInterceptor runs before() ahead of every Update.
type updateInterceptor struct {
	client.Client
	before func()
}

func interceptUpdate(c client.Client, before func()) client.Client {
	return &updateInterceptor{Client: c, before: before}
}

func (u *updateInterceptor) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	u.before()
	return u.Client.Update(ctx, obj, opts...)
}

// TestCARotationRunnable: the leader-only runnable rotates a due CA at once.
func TestCARotationRunnable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := pkitest.NewClock(time.Now())
	s := newFakeStore()
	a := mustLoad(t, s, pki.Options{Clock: clock.Now})
	original, _ := a.CAs()
	clock.Advance(300 * day)

	r := &Rotation{Store: s, Authority: a, Interval: 10 * time.Millisecond}
	if !r.NeedLeaderElection() || (&Sync{}).NeedLeaderElection() {
		t.Fatal("rotation must run on the leader only and sync on every replica")
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Start(runCtx) }()
	for {
		if cur, prev := a.CAs(); !cur.Equal(original) && prev.Equal(original) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the rotation runnable did not rotate a due CA")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := (&Rotation{Store: s, Authority: a, RotateWhenRemaining: 0.9}).Start(ctx); err == nil {
		t.Fatal("the rotation runnable accepted a threshold that drops a valid CA")
	}
}
