package postgres_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// The attack on the database: the encrypted row of Stack A's state is
// copied over Stack B's current version (with A's digest and size, so
// every plain check passes). B's state no longer opens, with an error
// that says the data was not sealed for it; A is untouched, and putting
// B's own row back recovers B.
func TestStateRowCopiedToAnotherStackFailsToOpen(t *testing.T) {
	key := newKey(t)
	s := open(t, postgres.Options{Keys: state.StaticKey(key)})
	ns := uniqueNamespace()
	a := state.Key{Namespace: ns, Stack: "a", Workspace: "default"}
	b := state.Key{Namespace: ns, Stack: "b", Workspace: "default"}
	if _, err := s.Put(ctx(t), a, storetest.StateJSON("lineage-a", 1, 1, 64), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx(t), b, storetest.StateJSON("lineage-b", 1, 2, 64), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	origA, _ := s.Get(ctx(t), a)
	origB, _ := s.Get(ctx(t), b)

	pool, err := pgxpool.New(ctx(t), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	type row struct {
		serial       int64
		lineage, dig string
		size         int64
		encoding     string
		data         []byte
	}
	read := func(k state.Key) row {
		var r row
		if err := pool.QueryRow(ctx(t), `SELECT serial, lineage, digest, size, encoding, data FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3 AND version=1`,
			k.Namespace, k.Stack, k.Workspace).Scan(&r.serial, &r.lineage, &r.dig, &r.size, &r.encoding, &r.data); err != nil {
			t.Fatal(err)
		}
		return r
	}
	write := func(k state.Key, r row) {
		if _, err := pool.Exec(ctx(t), `UPDATE terrace_state_versions SET serial=$4, lineage=$5, digest=$6, size=$7, encoding=$8, data=$9 WHERE namespace=$1 AND stack=$2 AND workspace=$3 AND version=1`,
			k.Namespace, k.Stack, k.Workspace, r.serial, r.lineage, r.dig, r.size, r.encoding, r.data); err != nil {
			t.Fatal(err)
		}
	}
	rowA, rowB := read(a), read(b)
	write(b, rowA)

	_, err = s.Get(ctx(t), b)
	var corrupt *state.CorruptError
	if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), "not sealed for state "+ns+"/b/default version 1") {
		t.Fatalf("B's state with A's row: %v", err)
	}
	if got, err := s.Get(ctx(t), a); err != nil || !bytes.Equal(got.Data, origA.Data) {
		t.Fatalf("A's state changed: %v", err)
	}
	write(b, rowB)
	if got, err := s.Get(ctx(t), b); err != nil || !bytes.Equal(got.Data, origB.Data) {
		t.Fatalf("B does not recover with its own row: %v", err)
	}
}

// A state written before binding existed still reads, and the next write
// stores the new version bound.
func TestUnboundStateStillReadsAndIsRewrittenBound(t *testing.T) {
	raw, key := storetest.RawKey(t)
	s := open(t, postgres.Options{Keys: state.StaticKey(key)})
	k := state.Key{Namespace: uniqueNamespace(), Stack: "old", Workspace: "default"}
	if _, err := s.Put(ctx(t), k, storetest.StateJSON("lineage-o", 1, 1, 64), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx(t), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	old := storetest.StateJSON("lineage-o", 1, 1, 64)
	sealed, encoding := storetest.SealUnbound(t, old, raw)
	if _, err := pool.Exec(ctx(t), `UPDATE terrace_state_versions SET encoding=$4, data=$5, digest=$6, size=$7 WHERE namespace=$1 AND stack=$2 AND workspace=$3`,
		k.Namespace, k.Stack, k.Workspace, encoding, sealed, state.Digest(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx(t), k)
	if err != nil || !bytes.Equal(got.Data, old) {
		t.Fatalf("unbound state does not read: %v", err)
	}
	if _, err := s.Put(ctx(t), k, storetest.StateJSON("lineage-o", 2, 1, 64), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	var newEncoding string
	if err := pool.QueryRow(ctx(t), `SELECT encoding FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3 AND version=2`, k.Namespace, k.Stack, k.Workspace).Scan(&newEncoding); err != nil {
		t.Fatal(err)
	}
	if !state.IsBound(newEncoding) {
		t.Fatalf("the next write kept the unbound format %q", newEncoding)
	}
	if v1, err := s.GetVersion(ctx(t), k, 1); err != nil || !bytes.Equal(v1.Data, old) {
		t.Fatalf("the unbound version in the history no longer reads: %v", err)
	}
}
