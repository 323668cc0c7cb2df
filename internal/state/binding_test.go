package state

import (
	"bytes"
	"compress/gzip"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

func testKey(t *testing.T) *EncryptionKey {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	k, err := ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The attack: someone who may write Secrets copies the sealed state of
// Stack A (or an older version, or a plan) into the place of another.
// Every such swap fails to open with an error naming the owner expected.
func TestSealedBlobOpensOnlyForItsOwner(t *testing.T) {
	key := testKey(t)
	a := Key{Namespace: "team", Stack: "a", Workspace: "default"}
	plain := []byte(`{"serial":3,"lineage":"l","outputs":{"password":"from-a"}}`)
	sealed, encoding, err := SealFor(plain, key, StateBinding(a, 3))
	if err != nil {
		t.Fatal(err)
	}
	if !IsBound(encoding) {
		t.Fatalf("a write used the unbound encoding %q", encoding)
	}
	if got, err := OpenFor(sealed, encoding, key, StateBinding(a, 3), "state"); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("owner cannot open its own blob: %v", err)
	}
	thieves := map[string]Binding{
		"another Stack":           StateBinding(Key{Namespace: "team", Stack: "b", Workspace: "default"}, 3),
		"another namespace":       StateBinding(Key{Namespace: "other", Stack: "a", Workspace: "default"}, 3),
		"another workspace":       StateBinding(Key{Namespace: "team", Stack: "a", Workspace: "prod"}, 3),
		"another version":         StateBinding(a, 4),
		"a plan":                  PlanBinding(PlanKey{Namespace: "team", Stack: "a", ID: "default"}, false),
		"shifted field boundary":  StateBinding(Key{Namespace: "tea", Stack: "ma", Workspace: "default"}, 3),
		"no owner (Open)":         {},
		"readable form of a plan": PlanBinding(PlanKey{Namespace: "team", Stack: "a", ID: "p1"}, true),
	}
	for name, b := range thieves {
		_, err := OpenFor(sealed, encoding, key, b, "state of "+b.String())
		var corrupt *CorruptError
		if !errors.As(err, &corrupt) {
			t.Errorf("%s: opened a blob sealed for %s: %v", name, StateBinding(a, 3), err)
			continue
		}
		if !strings.Contains(err.Error(), "not sealed for "+b.String()) {
			t.Errorf("%s: the error does not say whose data was expected: %v", name, err)
		}
	}

	// Relabelled as the old unbound format, a bound blob still fails: the
	// associated data it was sealed with is not supplied.
	old := encodingSealPrefix + key.Fingerprint()
	var corrupt *CorruptError
	if _, err := OpenFor(sealed, old, key, StateBinding(a, 3), "state"); !errors.As(err, &corrupt) {
		t.Fatalf("a bound blob relabelled as unbound opened: %v", err)
	}
}

// sealUnbound writes the first format, as Terrace did before binding.
func sealUnbound(t *testing.T, plain []byte, key *EncryptionKey) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(plain)
	_ = zw.Close()
	block, err := aes.NewCipher(key.key[:])
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, buf.Bytes(), nil), "gzip+aes256gcm:" + key.Fingerprint()
}

// State written before binding existed still opens, whoever asks, and is
// reported unbound so the store rewrites it.
func TestUnboundDataStillOpens(t *testing.T) {
	key := testKey(t)
	plain := []byte(`{"serial":1,"lineage":"old"}`)
	sealed, encoding := sealUnbound(t, plain, key)
	if IsBound(encoding) {
		t.Fatal("the old encoding is reported bound")
	}
	got, err := OpenFor(sealed, encoding, key, StateBinding(Key{Namespace: "n", Stack: "s", Workspace: "w"}, 7), "state")
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("old data does not open: %v", err)
	}
	if got, err := Open(sealed, encoding, key, "state"); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("old data does not open without an owner: %v", err)
	}
	if !IsBound(EncodingGzip) {
		t.Fatal("unencrypted data is reported as needing a rewrite")
	}
}
