package casecret

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/pki/pkitest"
)

func TestLoadOrCreateRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := newFakeStore()
	created := mustLoad(t, s, pki.Options{})
	secret := &corev1.Secret{}
	if err := s.Client.Get(ctx, caSecretKey, secret); err != nil {
		t.Fatal(err)
	}
	if secret.Type != corev1.SecretTypeOpaque || len(secret.Data[SecretKeyCACert]) == 0 || len(secret.Data[SecretKeyCAKey]) == 0 {
		t.Fatalf("stored Secret has type %q and keys %v", secret.Type, keys(secret.Data))
	}
	if _, ok := secret.Data[SecretKeyPreviousCACert]; ok {
		t.Fatal("a new CA Secret has a previous CA")
	}

	loaded := mustLoad(t, s, pki.Options{})
	c1, _ := created.CAs()
	c2, p2 := loaded.CAs()
	if !c1.Equal(c2) || p2 != nil {
		t.Fatal("loading the Secret did not return the stored CA")
	}
	// A leaf from one authority is trusted by the other: they are the same CA.
	leaf := issue(t, created, testRunner, time.Hour)
	cert, _ := leaf.Certificate()
	if _, err := verifyPeerCert(cert, loaded); err != nil {
		t.Fatalf("leaf from the creating replica refused by the loading one: %v", err)
	}
}

// TestLoadOrCreateFillsEmptySecret: an installer may create the Secret empty
// so RBAC can name it; the first controller fills it.
func TestLoadOrCreateFillsEmptySecret(t *testing.T) {
	ctx := context.Background()
	empty := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: caSecretKey.Name, Namespace: caSecretKey.Namespace}, Type: corev1.SecretTypeOpaque}
	s := newFakeStore(func(b *fake.ClientBuilder) { b.WithObjects(empty) })
	a := mustLoad(t, s, pki.Options{})
	stored := &corev1.Secret{}
	if err := s.Client.Get(ctx, caSecretKey, stored); err != nil {
		t.Fatal(err)
	}
	cur, _ := a.CAs()
	if string(stored.Data[SecretKeyCACert]) != string(cur.CertPEM()) {
		t.Fatal("the empty Secret was not filled with the CA in use")
	}
}

func TestLoadOrCreateRefusesCorruptSecret(t *testing.T) {
	ctx := context.Background()
	keyMaterial := "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END EC PRIVATE KEY-----\n"
	corrupt := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: caSecretKey.Name, Namespace: caSecretKey.Namespace},
		Data:       map[string][]byte{SecretKeyCACert: []byte("not a certificate"), SecretKeyCAKey: []byte(keyMaterial)},
	}
	s := newFakeStore(func(b *fake.ClientBuilder) { b.WithObjects(corrupt) })
	_, err := s.LoadOrCreate(ctx, pki.Options{})
	if err == nil {
		t.Fatal("loaded a corrupt CA Secret")
	}
	if strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("error leaks key material: %v", err)
	}
	if !strings.Contains(err.Error(), "delete it") {
		t.Fatalf("error does not say what to do: %v", err)
	}
	stored := &corev1.Secret{}
	if err := s.Client.Get(ctx, caSecretKey, stored); err != nil {
		t.Fatal(err)
	}
	if string(stored.Data[SecretKeyCACert]) != "not a certificate" {
		t.Fatal("a corrupt CA Secret was overwritten")
	}
}

// TestLoadOrCreateAdoptsRivalCreate: a replica that loses the create race
// adopts the winner's CA.
func TestLoadOrCreateAdoptsRivalCreate(t *testing.T) {
	ctx := context.Background()
	base := fake.NewClientBuilder().Build()
	var rival *pki.Authority
	racing := &createInterceptor{Client: base, before: func() {
		if rival != nil {
			return
		}
		var err error
		rival, err = (&Store{Client: base, Key: caSecretKey}).LoadOrCreate(ctx, pki.Options{})
		if err != nil {
			t.Errorf("rival: %v", err)
		}
	}}
	a, err := (&Store{Client: racing, Key: caSecretKey}).LoadOrCreate(ctx, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ours, _ := a.CAs()
	theirs, _ := rival.CAs()
	if !ours.Equal(theirs) {
		t.Fatal("the losing replica kept its own CA")
	}
}

type createInterceptor struct {
	client.Client
	before func()
}

func (c *createInterceptor) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.before()
	return c.Client.Create(ctx, obj, opts...)
}

func TestReloadPicksUpRotation(t *testing.T) {
	ctx := context.Background()
	clock := pkitest.NewClock(time.Now())
	s := newFakeStore()
	leader := mustLoad(t, s, pki.Options{Clock: clock.Now})
	follower := mustLoad(t, s, pki.Options{Clock: clock.Now})
	if changed, err := s.Reload(ctx, follower); err != nil || changed {
		t.Fatalf("changed=%v err=%v without a rotation", changed, err)
	}
	clock.Advance(300 * day)
	if rotated, err := s.RotateIfDue(ctx, leader, DefaultRotateWhenRemaining); err != nil || !rotated {
		t.Fatalf("rotated=%v err=%v", rotated, err)
	}
	if changed, err := s.Reload(ctx, follower); err != nil || !changed {
		t.Fatalf("changed=%v err=%v after the leader rotated", changed, err)
	}
	lc, lp := leader.CAs()
	fc, fp := follower.CAs()
	if !lc.Equal(fc) || !lp.Equal(fp) {
		t.Fatal("follower does not hold the leader's CAs")
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func verifyPeerCert(c *x509.Certificate, trust pki.TrustSource) (pki.Identity, error) {
	if _, err := c.Verify(x509.VerifyOptions{Roots: trust.TrustPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: time.Now()}); err != nil {
		return "", err
	}
	return pki.IdentityFromCertificate(c)
}

// TestCAExpiryGaugeFollowsTheStoredCA: the alert on
// terrace_ca_expiry_timestamp_seconds must see the CA the controller
// holds after it loads, rotates or reloads one.
func TestCAExpiryGaugeFollowsTheStoredCA(t *testing.T) {
	ctx := context.Background()
	clock := pkitest.NewClock(time.Now())
	s := newFakeStore()
	a := mustLoad(t, s, pki.Options{Clock: clock.Now})
	expiry := func() float64 {
		var m dto.Metric
		if err := caExpiry.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	held := func(a *pki.Authority) float64 {
		current, _ := a.CAs()
		return float64(current.Certificate().NotAfter.Unix())
	}
	if got, want := expiry(), held(a); got != want {
		t.Fatalf("after LoadOrCreate the gauge says %v, want %v", got, want)
	}
	loaded := held(a)
	clock.Advance(a.Options().CAValidity * 3 / 4)
	if rotated, err := s.RotateIfDue(ctx, a, DefaultRotateWhenRemaining); err != nil || !rotated {
		t.Fatalf("RotateIfDue = %v, %v; want a rotation", rotated, err)
	}
	if got, want := expiry(), held(a); got != want || got == loaded {
		t.Fatalf("after rotation the gauge says %v, want the new CA's %v", got, want)
	}
	caExpiry.Set(0)
	other, err := pki.NewAuthorityWithOptions(pki.Options{}) // a replica that has not read the Secret yet
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Reload(ctx, other); err != nil || !changed {
		t.Fatalf("Reload = %v, %v; want a change", changed, err)
	}
	if got, want := expiry(), held(a); got != want {
		t.Fatalf("after Reload the gauge says %v, want %v", got, want)
	}
}
