package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/fuzzcorpus"
)

// fuzzKey is the key every codec target seals and opens with.
func fuzzKey(t testing.TB) *EncryptionKey {
	k, err := ParseEncryptionKey(bytes.Repeat([]byte{0x5a}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// FuzzCodecRoundTrip seals a random state with and without the key, checks
// that it opens to the same bytes, then damages the sealed bytes as edits
// says. Damaged bytes open to an error or, where the damage is in a part
// gzip does not protect (header time and flags), to exactly the original;
// never to other data. Sealed with the key, any change is a CorruptError.
func FuzzCodecRoundTrip(f *testing.F) {
	f.Fuzz(func(t *testing.T, plain, edits []byte) {
		key := fuzzKey(t)
		for _, k := range []*EncryptionKey{nil, key} {
			sealed, encoding, err := Seal(plain, k)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Open(sealed, encoding, k, "fuzz")
			if err != nil || !bytes.Equal(got, plain) {
				t.Fatalf("round trip (key %v): %v, %d bytes back of %d", k != nil, err, len(got), len(plain))
			}
			damaged := applyEdits(sealed, edits)
			got, err = Open(damaged, encoding, k, "fuzz")
			var corrupt *CorruptError
			switch {
			case err != nil && !errors.As(err, &corrupt):
				t.Fatalf("damaged data (key %v) is not a CorruptError: %v", k != nil, err)
			case err == nil && !bytes.Equal(got, plain):
				t.Fatalf("damaged data (key %v) opened to other data: %d bytes, want %d", k != nil, len(got), len(plain))
			case err == nil && k != nil && !bytes.Equal(damaged, sealed):
				t.Fatalf("changed ciphertext opened without error (edits %x)", edits)
			}
		}
	})
}

// applyEdits changes data by a little program: each 4-byte instruction is
// an operation (flip a bit, set a byte, truncate, insert, delete) and a
// position taken modulo the length.
func applyEdits(data, edits []byte) []byte {
	out := bytes.Clone(data)
	for len(edits) >= 4 && len(out) > 0 {
		op, arg := edits[0]%5, edits[1]
		pos := int(binary.BigEndian.Uint16(edits[2:4])) % len(out)
		edits = edits[4:]
		switch op {
		case 0:
			out[pos] ^= 1 << (arg % 8)
		case 1:
			out[pos] = arg
		case 2:
			out = out[:pos]
		case 3:
			out = append(out[:pos:pos], append([]byte{arg}, out[pos:]...)...)
		case 4:
			out = append(out[:pos:pos], out[pos+1:]...)
		}
	}
	return out
}

// FuzzCodecOpen opens arbitrary bytes under an arbitrary encoding label.
// Nothing panics; bytes under the key's encryption never open (the fuzzer
// cannot forge GCM); damaged bytes and unknown encodings are CorruptErrors;
// a wrong or missing key is an error that says so, not corruption.
func FuzzCodecOpen(f *testing.F) {
	f.Fuzz(func(t *testing.T, stored []byte, encoding string) {
		key := fuzzKey(t)
		ownEncoding := encodingSealPrefix + key.Fingerprint()
		for _, k := range []*EncryptionKey{nil, key} {
			got, err := Open(stored, encoding, k, "fuzz")
			var corrupt *CorruptError
			isCorrupt := errors.As(err, &corrupt)
			switch {
			case encoding == ownEncoding && k != nil && err == nil:
				t.Fatalf("%d arbitrary bytes opened under the key's encryption", len(stored))
			case strings.HasPrefix(encoding, encodingSealPrefix) && (k == nil || encoding != ownEncoding):
				if err == nil || isCorrupt {
					t.Fatalf("encryption %q with key %v: want a key error, got %v", encoding, k != nil, err)
				}
			case err != nil && !isCorrupt:
				t.Fatalf("encoding %q: an error other than CorruptError: %v", encoding, err)
			case err != nil && got != nil:
				t.Fatalf("encoding %q: data returned with an error", encoding)
			}
			if encoding != EncodingGzip && !strings.HasPrefix(encoding, encodingSealPrefix) && !isCorrupt {
				t.Fatalf("unknown encoding %q: want CorruptError, got %v", encoding, err)
			}
		}
	})
}

func TestFuzzCodecSeedsAreCheckedIn(t *testing.T) {
	key := fuzzKey(t)
	ownEncoding := encodingSealPrefix + key.Fingerprint()
	stateJSON := []byte(`{"version":4,"terraform_version":"1.12.6","serial":7,"lineage":"3f1c","outputs":{"password":{"value":"s3cret","type":"string","sensitive":true}},"resources":[]}`)
	gz, _, err := Seal(stateJSON, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Edits: flip a bit in the middle, truncate the trailer, append a byte,
	// set the gzip mtime (unprotected), change the first byte.
	flipMiddle := []byte{0, 3, 0, 40}
	truncate := []byte{2, 0, 0xff, 0xf0}
	appendByte := []byte{3, 0x1f, 0xff, 0xff}
	mtime := []byte{1, 0x7f, 0, 5}
	first := []byte{1, 0, 0, 0}
	fuzzcorpus.Check(t, "FuzzCodecRoundTrip", []fuzzcorpus.Seed{
		{Name: "state-flip", Args: []any{stateJSON, flipMiddle}},
		{Name: "state-truncate", Args: []any{stateJSON, truncate}},
		{Name: "state-append", Args: []any{stateJSON, appendByte}},
		{Name: "state-gzip-mtime", Args: []any{stateJSON, mtime}},
		{Name: "state-first-byte", Args: []any{stateJSON, first}},
		{Name: "empty-flip", Args: []any{[]byte{}, flipMiddle}},
		{Name: "many-edits", Args: []any{bytes.Repeat([]byte(`{"serial":1}`), 300), bytes.Repeat([]byte{0, 1, 0, 9, 4, 0, 1, 0, 3, 9, 0, 2}, 8)}},
	})
	fuzzcorpus.Check(t, "FuzzCodecOpen", []fuzzcorpus.Seed{
		{Name: "gzip-valid", Args: []any{gz, EncodingGzip}},
		{Name: "gzip-garbage", Args: []any{[]byte("not gzip at all"), EncodingGzip}},
		{Name: "gzip-header-only", Args: []any{gz[:10], EncodingGzip}},
		{Name: "gzip-two-members", Args: []any{append(bytes.Clone(gz), gz...), EncodingGzip}},
		{Name: "sealed-garbage", Args: []any{bytes.Repeat([]byte{0xaa}, 64), ownEncoding}},
		{Name: "sealed-gzip-bytes", Args: []any{gz, ownEncoding}},
		{Name: "sealed-short", Args: []any{[]byte{1, 2, 3}, ownEncoding}},
		{Name: "sealed-other-key", Args: []any{bytes.Repeat([]byte{0xaa}, 64), encodingSealPrefix + "0000000000000000"}},
		{Name: "sealed-no-fingerprint", Args: []any{bytes.Repeat([]byte{0xaa}, 64), encodingSealPrefix}},
		{Name: "unknown-encoding", Args: []any{gz, "zstd"}},
		{Name: "empty", Args: []any{[]byte{}, ""}},
	})
}
