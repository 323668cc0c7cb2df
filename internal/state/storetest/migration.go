package storetest

// Migration (a state carried to another backend unchanged) and states of many
// MiB: the conformance cases that move or hold the most bytes.

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
)

func testMigration(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "mig", Workspace: "default"}
	mustPut(t, b.States, key, StateJSON("l", 1, 0, 100), state.PutOptions{})
	mark := &state.MigrationMark{To: "postgres", At: time.Now().UTC().Truncate(time.Second)}
	if err := b.States.MarkMigrated(ctx, key, mark); err != nil {
		t.Fatalf("MarkMigrated: %v", err)
	}
	got, err := b.States.Migrated(ctx, key)
	if err != nil || got == nil || got.To != "postgres" || !got.At.Equal(mark.At) {
		t.Fatalf("Migrated: %+v, %v", got, err)
	}
	if _, err := b.States.Put(ctx, key, StateJSON("l", 2, 0, 100), state.PutOptions{}); !errors.Is(err, state.ErrMigrated) {
		t.Fatalf("Put on a migrated state: got %v, want ErrMigrated", err)
	}
	if err := b.States.Lock(ctx, key, state.LockInfo{ID: "x"}); !errors.Is(err, state.ErrMigrated) {
		t.Fatalf("Lock on a migrated state: got %v, want ErrMigrated", err)
	}
	if _, err := b.States.Get(ctx, key); err != nil {
		t.Fatalf("a migrated state must stay readable: %v", err)
	}

	// ReplaceHistory installs a foreign history verbatim and clears the mark.
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	history := []state.State{
		{StateMeta: state.StateMeta{Version: 7, CreatedAt: created}, Data: StateJSON("other", 3, 0, 500)},
		{StateMeta: state.StateMeta{Version: 8, CreatedAt: created.Add(time.Hour)}, Data: StateJSON("other", 4, 0, 500)},
	}
	if err := b.States.ReplaceHistory(ctx, key, history); err != nil {
		t.Fatalf("ReplaceHistory: %v", err)
	}
	if m, err := b.States.Migrated(ctx, key); err != nil || m != nil {
		t.Fatalf("mark after ReplaceHistory: %+v, %v", m, err)
	}
	versions, err := b.States.ListVersions(ctx, key)
	if err != nil || len(versions) != 2 {
		t.Fatalf("ListVersions after ReplaceHistory: %v, %v", versions, err)
	}
	for i, v := range versions {
		want := history[len(history)-1-i]
		if v.Version != want.Version || !v.CreatedAt.Equal(want.CreatedAt) || v.Digest != state.Digest(want.Data) {
			t.Fatalf("version %d is %+v, want version %d created %s", i, v, want.Version, want.CreatedAt)
		}
	}
	meta := mustPut(t, b.States, key, StateJSON("other", 5, 0, 100), state.PutOptions{IfMatch: 8})
	if meta.Version != 9 {
		t.Fatalf("Put after ReplaceHistory got version %d, want 9", meta.Version)
	}
	if err := b.States.Lock(ctx, key, state.LockInfo{ID: "held"}); err != nil {
		t.Fatal(err)
	}
	var locked *state.LockedError
	if err := b.States.ReplaceHistory(ctx, key, history); !errors.As(err, &locked) {
		t.Fatalf("ReplaceHistory on a locked state: got %v, want a LockedError", err)
	}
}

func testLargeState(t *testing.T, b Backend) {
	ctx := ctxFor(t, 3*time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "large", Workspace: "default"}
	data := StateJSON("big", 1, 0, 10<<20)
	if len(data) < 10<<20 {
		t.Fatalf("test state is only %d bytes", len(data))
	}
	mustPut(t, b.States, key, data, state.PutOptions{})
	got, err := b.States.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get of a 10 MiB state: %v", err)
	}
	if !bytes.Equal(got.Data, data) {
		t.Fatalf("10 MiB state came back different (%d bytes, want %d)", len(got.Data), len(data))
	}
	// A second version replaces it; the first stays readable from history.
	data2 := StateJSON("big", 2, 0, 10<<20)
	mustPut(t, b.States, key, data2, state.PutOptions{IfMatch: got.Version})
	old, err := b.States.GetVersion(ctx, key, got.Version)
	if err != nil || !bytes.Equal(old.Data, data) {
		t.Fatalf("previous 10 MiB version: %v", err)
	}
}
