package storetest

import (
	"bytes"
	"compress/gzip"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
)

// RawKey returns a new encryption key and its bytes, so a test can seal
// the way Terrace did before blobs were bound to their owner (SealUnbound).
func RawKey(t testing.TB) ([]byte, *state.EncryptionKey) {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	k, err := state.ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, k
}

// SealUnbound seals plain with the key bytes raw in the first sealed
// format (gzip, AES-256-GCM, no associated data) and returns the blob and
// its encoding.
func SealUnbound(t testing.TB, plain, raw []byte) ([]byte, string) {
	t.Helper()
	k, err := state.ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(plain)
	_ = zw.Close()
	block, err := aes.NewCipher(raw)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, buf.Bytes(), nil), "gzip+aes256gcm:" + k.Fingerprint()
}
