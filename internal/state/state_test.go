package state

import (
	"bytes"
	"encoding/base64"
	"errors"
	"testing"
)

func TestSealOpen(t *testing.T) {
	plain := bytes.Repeat([]byte(`{"serial":1,"lineage":"x"}`), 1000)
	raw := bytes.Repeat([]byte{7}, 32)
	key, err := ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	fromBase64, err := ParseEncryptionKey([]byte(base64.StdEncoding.EncodeToString(raw) + "\n"))
	if err != nil || fromBase64.Fingerprint() != key.Fingerprint() {
		t.Fatalf("base64 key: %v", err)
	}
	for _, bad := range [][]byte{nil, []byte("short"), bytes.Repeat([]byte{1}, 31), []byte(base64.StdEncoding.EncodeToString(raw[:16]))} {
		if _, err := ParseEncryptionKey(bad); err == nil {
			t.Fatalf("key %q accepted", bad)
		}
	}
	other, _ := ParseEncryptionKey(bytes.Repeat([]byte{8}, 32))

	for name, k := range map[string]*EncryptionKey{"plain": nil, "encrypted": key} {
		t.Run(name, func(t *testing.T) {
			sealed, encoding, err := Seal(plain, k)
			if err != nil {
				t.Fatal(err)
			}
			if len(sealed) >= len(plain)/10 {
				t.Fatalf("sealed %d bytes of very repetitive input into %d", len(plain), len(sealed))
			}
			got, err := Open(sealed, encoding, k, "x")
			if err != nil || !bytes.Equal(got, plain) {
				t.Fatalf("round trip: %v", err)
			}
			damaged := bytes.Clone(sealed)
			damaged[len(damaged)/2] ^= 1
			var corrupt *CorruptError
			if _, err := Open(damaged, encoding, k, "x"); !errors.As(err, &corrupt) {
				t.Fatalf("damaged data: %v", err)
			}
			if _, err := Open(sealed[:len(sealed)-4], encoding, k, "x"); !errors.As(err, &corrupt) {
				t.Fatalf("truncated data: %v", err)
			}
			if k != nil {
				if _, err := Open(sealed, encoding, other, "x"); err == nil || errors.As(err, &corrupt) {
					t.Fatalf("wrong key must be a key error, not corruption: %v", err)
				}
				if _, err := Open(sealed, encoding, nil, "x"); err == nil {
					t.Fatal("opened encrypted data without a key")
				}
			}
		})
	}
}

func TestWriteRules(t *testing.T) {
	cur := &StateMeta{Version: 4, Serial: 10, Lineage: "a"}
	cases := []struct {
		name   string
		header Header
		force  bool
		reason ConflictReason
	}{
		{"next serial", Header{Serial: 11, Lineage: "a"}, false, ""},
		{"same serial", Header{Serial: 10, Lineage: "a"}, false, ""},
		{"lower serial", Header{Serial: 9, Lineage: "a"}, false, ConflictSerial},
		{"other lineage", Header{Serial: 11, Lineage: "b"}, false, ConflictLineage},
		{"forced", Header{Serial: 1, Lineage: "b"}, true, ""},
		{"no lineage yet", Header{Serial: 11}, false, ""},
	}
	for _, c := range cases {
		err := CheckSuccessor("k", cur, c.header, c.force)
		var conflict *ConflictError
		if c.reason == "" && err != nil || c.reason != "" && (!errors.As(err, &conflict) || conflict.Reason != c.reason) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.reason)
		}
	}
	if err := CheckSuccessor("k", nil, Header{Serial: 0}, false); err != nil {
		t.Errorf("first state: %v", err)
	}
	for _, c := range []struct {
		current, ifMatch Version
		ok               bool
	}{{0, AnyVersion, true}, {3, AnyVersion, true}, {0, Absent, true}, {3, Absent, false}, {3, 3, true}, {3, 2, false}, {0, 1, false}} {
		if err := CheckVersion("k", c.current, c.ifMatch); (err == nil) != c.ok {
			t.Errorf("CheckVersion(%d, %d) = %v", c.current, c.ifMatch, err)
		}
	}
	if _, err := ParseHeader([]byte(`[1,2]`)); !errors.Is(err, ErrInvalidState) {
		t.Errorf("array state: %v", err)
	}
	if h, err := ParseHeader([]byte(`{"serial":3,"lineage":"l","encrypted_data":"..."}`)); err != nil || h.Serial != 3 || h.Lineage != "l" {
		t.Errorf("encrypted tofu state header: %+v %v", h, err)
	}
}

func TestKeyValidation(t *testing.T) {
	for _, k := range []Key{{"", "s", "w"}, {"n", "a/b", "w"}, {"n", "s", "w x"}, {"n", "s", ""}} {
		if k.Validate() == nil {
			t.Errorf("%+v accepted", k)
		}
	}
	if err := (Key{"ns", "stack", "Weird_ws-1"}).Validate(); err != nil {
		t.Error(err)
	}
}
