package state

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Encodings of stored blobs: gzip, optionally sealed with AES-256-GCM. The
// encoding, kept next to the blob, is the envelope's version:
//   - "gzip+aes256gcm-v2:<fingerprint>" is sealed with associated data that
//     binds the blob to its owner (a [Binding]); every write uses it;
//   - "gzip+aes256gcm:<fingerprint>" is the first format, without
//     associated data. It is still read, so state written before binding
//     existed opens, and the next write of that state replaces it.
//
// A bound blob relabelled as the old format still fails to open: GCM checks
// the associated data it was sealed with, and the old format supplies none.
const (
	EncodingGzip        = "gzip"
	encodingSealPrefix  = "gzip+aes256gcm:"
	encodingBoundPrefix = "gzip+aes256gcm-v2:"
)

// Binding names the owner of a sealed blob: it is the AES-GCM associated
// data, so ciphertext copied to another namespace, Stack, workspace, state
// version or plan (or a plan file swapped with its readable form) fails
// authentication instead of being accepted as the owner's own. A blob is
// sealed whole before it is cut into chunks, so a chunk moved, reordered
// or replaced within the blob breaks the same authentication.
type Binding struct {
	// Kind is what the blob is: "state", "plan" or "readable-plan".
	Kind      string
	Namespace string
	Stack     string
	// Workspace and Version bind a state version.
	Workspace string
	Version   int64
	// Plan is the plan id of a plan blob.
	Plan string
}

// StateBinding binds a blob to one version of one state.
func StateBinding(key Key, version Version) Binding {
	return Binding{Kind: "state", Namespace: key.Namespace, Stack: key.Stack, Workspace: key.Workspace, Version: int64(version)}
}

// PlanBinding binds a blob to a saved plan's file, or its readable form.
func PlanBinding(key PlanKey, readable bool) Binding {
	kind := "plan"
	if readable {
		kind = "readable-plan"
	}
	return Binding{Kind: kind, Namespace: key.Namespace, Stack: key.Stack, Plan: key.ID}
}

// String names the owner in errors.
func (b Binding) String() string {
	switch b.Kind {
	case "state":
		return fmt.Sprintf("state %s/%s/%s version %d", b.Namespace, b.Stack, b.Workspace, b.Version)
	case "":
		return "unbound data"
	}
	return fmt.Sprintf("%s %s/%s/%s", b.Kind, b.Namespace, b.Stack, b.Plan)
}

// associatedData encodes every field length-prefixed, so no two bindings
// share an encoding ("a/b" + "c" never equals "a" + "b/c").
func (b Binding) associatedData() []byte {
	out := []byte("terrace.dev/seal/v2")
	for _, f := range []string{b.Kind, b.Namespace, b.Stack, b.Workspace, b.Plan} {
		out = binary.BigEndian.AppendUint32(out, uint32(len(f)))
		out = append(out, f...)
	}
	return binary.BigEndian.AppendUint64(out, uint64(b.Version))
}

// EncryptionKey is an AES-256 key for state and plans at rest.
type EncryptionKey struct {
	key         [32]byte
	fingerprint string
}

// ParseEncryptionKey accepts 32 raw bytes or their standard base64 encoding
// (the two forms TerraceConfig's keySecretRef allows).
func ParseEncryptionKey(data []byte) (*EncryptionKey, error) {
	raw := data
	if len(raw) != 32 {
		decoded, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
		if err != nil || len(decoded) != 32 {
			return nil, errors.New("encryption key must be 32 bytes, raw or base64-encoded")
		}
		raw = decoded
	}
	k := &EncryptionKey{}
	copy(k.key[:], raw)
	sum := sha256.Sum256(append([]byte("terrace-state-key:"), raw...))
	k.fingerprint = hex.EncodeToString(sum[:8])
	return k, nil
}

// Fingerprint identifies the key without revealing it.
func (k *EncryptionKey) Fingerprint() string { return k.fingerprint }

// KeySource returns the encryption key for a namespace, or nil for none.
type KeySource func(ctx context.Context, namespace string) (*EncryptionKey, error)

// StaticKey returns a KeySource with the same key (or none, when nil) for every namespace.
func StaticKey(k *EncryptionKey) KeySource {
	return func(context.Context, string) (*EncryptionKey, error) { return k, nil }
}

// Seal is SealFor with no owner (the zero Binding), for blobs that belong
// to nothing in particular. Stores use SealFor.
func Seal(plain []byte, key *EncryptionKey) ([]byte, string, error) {
	return SealFor(plain, key, Binding{})
}

// Open is OpenFor with no owner (the zero Binding).
func Open(stored []byte, encoding string, key *EncryptionKey, what string) ([]byte, error) {
	return OpenFor(stored, encoding, key, Binding{}, what)
}

// SealFor compresses plain and, with a key, encrypts it bound to owner. It
// returns the stored bytes and their encoding, which OpenFor needs back.
func SealFor(plain []byte, key *EncryptionKey, owner Binding) ([]byte, string, error) {
	compressed, err := Gzip(plain, gzip.BestSpeed)
	if err != nil {
		return nil, "", err
	}
	if key == nil {
		return compressed, EncodingGzip, nil
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, "", err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(compressed)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, "", fmt.Errorf("failed to make a nonce: %w", err)
	}
	return aead.Seal(nonce, nonce, compressed, owner.associatedData()), encodingBoundPrefix + key.fingerprint, nil
}

// IsBound reports whether an encoding carries an owner binding (or needs
// none: unencrypted data). A state read in the old unbound format is
// rewritten bound by its next write.
func IsBound(encoding string) bool { return !strings.HasPrefix(encoding, encodingSealPrefix) }

// OpenFor reverses SealFor; owner must be the Binding the blob was sealed
// for. Blobs of the old unbound format open without one. what names the
// object in errors. Damaged bytes, and bytes sealed for another owner, are
// a [*CorruptError]; a missing or different key is a plain error saying so.
func OpenFor(stored []byte, encoding string, key *EncryptionKey, owner Binding, what string) ([]byte, error) {
	compressed := stored
	var err error
	switch {
	case encoding == EncodingGzip:
	case strings.HasPrefix(encoding, encodingBoundPrefix):
		compressed, err = decrypt(stored, strings.TrimPrefix(encoding, encodingBoundPrefix), key, &owner, what)
	case strings.HasPrefix(encoding, encodingSealPrefix):
		compressed, err = decrypt(stored, strings.TrimPrefix(encoding, encodingSealPrefix), key, nil, what)
	default:
		return nil, &CorruptError{What: what, Reason: fmt.Sprintf("unknown encoding %q", encoding)}
	}
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(compressed))
	if err != nil {
		return nil, &CorruptError{What: what, Reason: "not gzip data"}
	}
	// Whoever may write the namespace's Secrets can plant a small chunk
	// that inflates without end; the shared controller must not hold it.
	plain, err := io.ReadAll(io.LimitReader(zr, MaxOpenedBytes+1))
	if err != nil {
		return nil, &CorruptError{What: what, Reason: "gzip data is damaged"}
	}
	if int64(len(plain)) > MaxOpenedBytes {
		return nil, &CorruptError{What: what, Reason: fmt.Sprintf("it inflates beyond %d bytes, more than any state or plan Terrace writes", MaxOpenedBytes)}
	}
	return plain, nil
}

// MaxOpenedBytes bounds what Open inflates: four times the state server's
// default upload limit and above every plan limit, so only data Terrace
// did not write reaches it.
const MaxOpenedBytes = 256 << 20

// decrypt opens nonce||ciphertext with key (whose fingerprint must be want),
// authenticating owner as the associated data; a nil owner is the old
// unbound format, sealed without any.
func decrypt(stored []byte, want string, key *EncryptionKey, owner *Binding, what string) ([]byte, error) {
	if key == nil {
		return nil, fmt.Errorf("%s is encrypted (key %s) but no encryption key is configured", what, want)
	}
	if key.fingerprint != want {
		return nil, fmt.Errorf("%s is encrypted with key %s, the configured key is %s", what, want, key.fingerprint)
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	if len(stored) < aead.NonceSize() {
		return nil, &CorruptError{What: what, Reason: "encrypted data shorter than its nonce"}
	}
	var ad []byte
	if owner != nil {
		ad = owner.associatedData()
	}
	plain, err := aead.Open(nil, stored[:aead.NonceSize()], stored[aead.NonceSize():], ad)
	switch {
	case err == nil:
		return plain, nil
	case owner == nil:
		return nil, &CorruptError{What: what, Reason: "authenticated decryption failed"}
	default:
		return nil, &CorruptError{What: what, Reason: fmt.Sprintf("authenticated decryption failed: the data was not sealed for %s (copied from another Stack, workspace, version or plan?) or is damaged; restore this object from its own backup", *owner)}
	}
}

func newAEAD(key *EncryptionKey) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key.key[:])
	if err != nil {
		return nil, fmt.Errorf("failed to set up AES: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("failed to set up GCM: %w", err)
	}
	return aead, nil
}
