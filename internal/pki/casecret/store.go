// Package casecret keeps the controller's certificate authority in a Secret
// of its namespace, shared by its replicas, and rotates it: the part of the
// PKI that talks to the API server, apart from internal/pki so that the
// runner binary links no Kubernetes client.
package casecret

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/pki"
)

// Keys of the CA Secret.
const (
	SecretKeyCACert         = "ca.crt"
	SecretKeyCAKey          = "ca.key"
	SecretKeyPreviousCACert = "previous-ca.crt"
	SecretKeyPreviousCAKey  = "previous-ca.key"
)

// maxConflictRetries bounds how often a write that lost a race is retried
// after re-reading the Secret.
const maxConflictRetries = 5

// Store keeps an Authority's CAs in an Opaque Secret of the controller's
// namespace: the current CA and the one it replaced. Every write is a create
// or a compare-and-swap on resourceVersion, so replicas that race end with
// the same CAs.
type Store struct {
	// Client creates and updates the Secret.
	Client client.Client
	// Reader reads it; pass the manager's API reader so reads are never
	// served by a stale cache. Nil means Client.
	Reader client.Reader
	// Key names the Secret.
	Key types.NamespacedName
}

func (s *Store) reader() client.Reader {
	if s.Reader != nil {
		return s.Reader
	}
	return s.Client
}

// storedCAs is what the Secret holds, with the object to update.
type storedCAs struct {
	secret            *corev1.Secret
	current, previous *pki.CA
}

// get reads the Secret; a missing Secret or one without CA data (e.g. created
// empty by an installer so RBAC can name it) yields a nil current CA.
func (s *Store) get(ctx context.Context) (*storedCAs, error) {
	secret := &corev1.Secret{}
	if err := s.reader().Get(ctx, s.Key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return &storedCAs{}, nil
		}
		return nil, fmt.Errorf("failed to read CA Secret %s: %w", s.Key, err)
	}
	current, previous, err := decodeCAs(secret.Data)
	if err != nil {
		return nil, fmt.Errorf("CA Secret %s is unusable (delete it to generate a new CA; every issued certificate will stop working): %w", s.Key, err)
	}
	return &storedCAs{secret: secret, current: current, previous: previous}, nil
}

// put writes current and previous: a create when there is no Secret, else an
// update conditional on the resourceVersion read. It reports lost races as
// errors for which apierrors.IsConflict or IsAlreadyExists is true.
func (s *Store) put(ctx context.Context, stored *storedCAs, current, previous *pki.CA) error {
	data := encodeCAs(current, previous)
	if stored.secret == nil {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:      s.Key.Name,
				Namespace: s.Key.Namespace,
				Labels:    map[string]string{"app.kubernetes.io/name": "terrace", "app.kubernetes.io/component": "ca"},
			},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		return s.Client.Create(ctx, secret)
	}
	secret := stored.secret.DeepCopy()
	secret.Data = data
	// secret carries the resourceVersion that was read, so this is a compare-and-swap.
	return s.Client.Update(ctx, secret)
}

func lostRace(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }

// LoadOrCreate returns an Authority over the CAs in the Secret, generating
// and storing a CA when there is none. When replicas start together, one
// write wins and the others adopt its CA.
func (s *Store) LoadOrCreate(ctx context.Context, opts pki.Options) (*pki.Authority, error) {
	opts, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	for range maxConflictRetries {
		stored, err := s.get(ctx)
		if err != nil {
			return nil, err
		}
		if stored.current != nil {
			return newAuthority(opts, stored.current, stored.previous)
		}
		ca, err := pki.GenerateCA(opts.CAValidity, opts.Clock())
		if err != nil {
			return nil, err
		}
		err = s.put(ctx, stored, ca, nil)
		if err == nil {
			return newAuthority(opts, ca, nil)
		}
		if !lostRace(err) {
			return nil, fmt.Errorf("failed to store new CA in Secret %s: %w", s.Key, err)
		}
	}
	return nil, fmt.Errorf("failed to load or create CA Secret %s: it kept changing under %d attempts", s.Key, maxConflictRetries)
}

// Reload makes a hold the CAs stored in the Secret and reports whether they changed.
func (s *Store) Reload(ctx context.Context, a *pki.Authority) (bool, error) {
	stored, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	if stored.current == nil {
		return false, fmt.Errorf("CA Secret %s is missing or empty", s.Key)
	}
	current, previous := a.CAs()
	if current.Equal(stored.current) && previous.Equal(stored.previous) {
		return false, nil
	}
	return true, setCAs(a, stored.current, stored.previous)
}

func encodeCAs(current, previous *pki.CA) map[string][]byte {
	data := map[string][]byte{
		SecretKeyCACert: bytes.Clone(current.CertPEM()),
		SecretKeyCAKey:  bytes.Clone(current.KeyPEM()),
	}
	if previous != nil {
		data[SecretKeyPreviousCACert] = bytes.Clone(previous.CertPEM())
		data[SecretKeyPreviousCAKey] = bytes.Clone(previous.KeyPEM())
	}
	return data
}

// decodeCAs parses the Secret's data; no CA keys at all is not an error.
func decodeCAs(data map[string][]byte) (current, previous *pki.CA, err error) {
	if len(data[SecretKeyCACert]) == 0 && len(data[SecretKeyCAKey]) == 0 {
		if len(data[SecretKeyPreviousCACert]) != 0 {
			return nil, nil, errors.New("it has a previous CA but no current one")
		}
		return nil, nil, nil
	}
	current, err = pki.ParseCA(data[SecretKeyCACert], data[SecretKeyCAKey])
	if err != nil {
		return nil, nil, fmt.Errorf("current CA: %w", err)
	}
	if len(data[SecretKeyPreviousCACert]) == 0 && len(data[SecretKeyPreviousCAKey]) == 0 {
		return current, nil, nil
	}
	previous, err = pki.ParseCA(data[SecretKeyPreviousCACert], data[SecretKeyPreviousCAKey])
	if err != nil {
		return nil, nil, fmt.Errorf("previous CA: %w", err)
	}
	return current, previous, nil
}

// newAuthority is pki.NewAuthorityFromCAs, its CA's expiry recorded.
func newAuthority(opts pki.Options, current, previous *pki.CA) (*pki.Authority, error) {
	a, err := pki.NewAuthorityFromCAs(opts, current, previous)
	if err == nil {
		recordCAExpiry(current)
	}
	return a, err
}

// setCAs is a.SetCAs, the current CA's expiry recorded.
func setCAs(a *pki.Authority, current, previous *pki.CA) error {
	if err := a.SetCAs(current, previous); err != nil {
		return err
	}
	recordCAExpiry(current)
	return nil
}
