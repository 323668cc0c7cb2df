package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

var dbURL string

func TestMain(m *testing.M) {
	pgtest.Main(func(url string) int { dbURL = url; return m.Run() })
}

func uniqueNamespace() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "pg-" + hex.EncodeToString(b)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, opts postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(ctx(t), dbURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newKey(t *testing.T) *state.EncryptionKey {
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	k, err := state.ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestConformance(t *testing.T) {
	key := newKey(t)
	storetest.RunConformance(t, func(t *testing.T) storetest.Backend {
		s := open(t, postgres.Options{History: 3, Keys: state.StaticKey(key)})
		return storetest.Backend{States: s, Plans: s, Releases: s, Namespace: uniqueNamespace(), History: 3}
	})
}

// Damaged bytes in the table are reported, never returned.
func TestCorruptRowIsAnError(t *testing.T) {
	s := open(t, postgres.Options{})
	key := state.Key{Namespace: uniqueNamespace(), Stack: "app", Workspace: "default"}
	if _, err := s.Put(ctx(t), key, storetest.StateJSON("l", 1, 0, 10<<20), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx(t), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx(t), `UPDATE terrace_state_versions SET data = overlay(data placing '\xdeadbeef'::bytea from 5000) WHERE namespace=$1`, key.Namespace); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx(t), key)
	var corrupt *state.CorruptError
	if !errors.As(err, &corrupt) {
		t.Fatalf("Get of a damaged row returned %v, want a CorruptError", err)
	}
}

func TestEncryptionKeyMustMatch(t *testing.T) {
	key := state.Key{Namespace: uniqueNamespace(), Stack: "enc", Workspace: "default"}
	if _, err := open(t, postgres.Options{Keys: state.StaticKey(newKey(t))}).Put(ctx(t), key, storetest.StateJSON("l", 1, 0, 100), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, postgres.Options{}).Get(ctx(t), key); err == nil || !strings.Contains(err.Error(), "key") {
		t.Fatalf("Get without the key returned %v", err)
	}
}

func TestBadConnectionStringDoesNotLeakIt(t *testing.T) {
	_, err := postgres.Open(ctx(t), "postgres://user:s3cret-password@[::1", postgres.Options{})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open with a broken URL returned %v", err)
	}
}
