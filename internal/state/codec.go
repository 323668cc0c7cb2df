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
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Encodings of stored blobs: gzip, optionally sealed with AES-256-GCM.
const (
	EncodingGzip       = "gzip"
	encodingSealPrefix = "gzip+aes256gcm:"
)

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

// Seal compresses plain and, with a key, encrypts it. It returns the stored
// bytes and their encoding, which Open needs back.
func Seal(plain []byte, key *EncryptionKey) ([]byte, string, error) {
	var buf bytes.Buffer
	buf.Grow(len(plain)/4 + 64)
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, "", fmt.Errorf("failed to start gzip: %w", err)
	}
	if _, err := zw.Write(plain); err != nil {
		return nil, "", fmt.Errorf("failed to compress: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("failed to compress: %w", err)
	}
	if key == nil {
		return buf.Bytes(), EncodingGzip, nil
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, "", err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+buf.Len()+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, "", fmt.Errorf("failed to make a nonce: %w", err)
	}
	return aead.Seal(nonce, nonce, buf.Bytes(), nil), encodingSealPrefix + key.fingerprint, nil
}

// Open reverses Seal. what names the object in errors. Damaged bytes are a
// [*CorruptError]; a missing or different key is a plain error saying so.
func Open(stored []byte, encoding string, key *EncryptionKey, what string) ([]byte, error) {
	compressed := stored
	switch {
	case encoding == EncodingGzip:
	case strings.HasPrefix(encoding, encodingSealPrefix):
		want := strings.TrimPrefix(encoding, encodingSealPrefix)
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
		compressed, err = aead.Open(nil, stored[:aead.NonceSize()], stored[aead.NonceSize():], nil)
		if err != nil {
			return nil, &CorruptError{What: what, Reason: "authenticated decryption failed"}
		}
	default:
		return nil, &CorruptError{What: what, Reason: fmt.Sprintf("unknown encoding %q", encoding)}
	}
	zr, err := gzip.NewReader(bytes.NewReader(compressed))
	if err != nil {
		return nil, &CorruptError{What: what, Reason: "not gzip data"}
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		return nil, &CorruptError{What: what, Reason: "gzip data is damaged"}
	}
	return plain, nil
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
