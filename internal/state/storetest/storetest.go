// Package storetest is the behaviour every state backend must show: the
// same suite runs against the Secrets and the PostgreSQL implementations.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// Backend is one backend's stores, scoped to a fresh namespace.
type Backend struct {
	States   state.Store
	Plans    state.PlanStore
	Releases release.Store
	// Namespace is a namespace no other test uses (it exists, for Secrets).
	Namespace string
	// History is the state history limit the stores were built with.
	History int
}

// StateJSON returns a state JSON document with the given lineage and
// serial, padded with payloadSize bytes of incompressible text (so chunking
// is exercised) and a counter the concurrency test increments.
func StateJSON(lineage string, serial int64, counter int, payloadSize int) []byte {
	raw := make([]byte, payloadSize*3/4+1)
	_, _ = rand.Read(raw)
	payload := base64.StdEncoding.EncodeToString(raw)[:payloadSize]
	doc := map[string]any{
		"version": 4, "terraform_version": "1.12.6", "serial": serial, "lineage": lineage,
		"outputs":   map[string]any{"counter": map[string]any{"value": counter, "type": "number"}},
		"resources": []any{map[string]any{"mode": "managed", "type": "terraform_data", "name": "pad", "instances": []any{map[string]any{"attributes": map[string]any{"input": payload}}}}},
	}
	out, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return out
}

// Counter reads the counter StateJSON wrote.
func Counter(data []byte) (int, error) {
	var doc struct {
		Outputs struct {
			Counter struct {
				Value int `json:"value"`
			} `json:"counter"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return 0, err
	}
	return doc.Outputs.Counter.Value, nil
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// RunConformance runs the whole suite; newBackend is called once per subtest.
func RunConformance(t *testing.T, newBackend func(t *testing.T) Backend) {
	t.Run("StateRoundTrip", func(t *testing.T) { testStateRoundTrip(t, newBackend(t)) })
	t.Run("SerialAndLineage", func(t *testing.T) { testSerialAndLineage(t, newBackend(t)) })
	t.Run("CompareAndSwap", func(t *testing.T) { testCompareAndSwap(t, newBackend(t)) })
	t.Run("History", func(t *testing.T) { testHistory(t, newBackend(t)) })
	t.Run("Locks", func(t *testing.T) { testLocks(t, newBackend(t)) })
	t.Run("DeleteAndList", func(t *testing.T) { testDeleteAndList(t, newBackend(t)) })
	t.Run("MigrationMarkAndReplaceHistory", func(t *testing.T) { testMigration(t, newBackend(t)) })
	t.Run("ConcurrentWriters", func(t *testing.T) { testConcurrentWriters(t, newBackend(t)) })
	t.Run("LargeState10MiB", func(t *testing.T) { testLargeState(t, newBackend(t)) })
	t.Run("Plans", func(t *testing.T) { testPlans(t, newBackend(t)) })
	t.Run("Releases", func(t *testing.T) { testReleases(t, newBackend(t)) })
}

func testStateRoundTrip(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "app", Workspace: "default"}
	if _, err := b.States.Get(ctx, key); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get of a missing state: got %v, want ErrNotFound", err)
	}
	if versions, err := b.States.ListVersions(ctx, key); err != nil || len(versions) != 0 {
		t.Fatalf("ListVersions of a missing state: %v, %v", versions, err)
	}
	if lock, err := b.States.GetLock(ctx, key); err != nil || lock != nil {
		t.Fatalf("GetLock of a missing state: %v, %v", lock, err)
	}
	data := StateJSON("lin-1", 1, 0, 2000)
	meta, err := b.States.Put(ctx, key, data, state.PutOptions{IfMatch: state.Absent})
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if meta.Version != 1 || meta.Serial != 1 || meta.Lineage != "lin-1" || meta.Digest != state.Digest(data) || meta.Size != int64(len(data)) {
		t.Fatalf("Put returned %+v", meta)
	}
	got, err := b.States.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !bytes.Equal(got.Data, data) || got.Version != 1 || got.Digest != meta.Digest || got.CreatedAt.IsZero() {
		t.Fatalf("Get returned other data or metadata: %+v", got.StateMeta)
	}
	if _, err := b.States.Put(ctx, key, []byte("not json"), state.PutOptions{}); !errors.Is(err, state.ErrInvalidState) {
		t.Fatalf("Put of a non-JSON state: got %v, want ErrInvalidState", err)
	}
	other := state.Key{Namespace: b.Namespace, Stack: "app", Workspace: "staging"}
	if _, err := b.States.Get(ctx, other); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("another workspace sees the state: %v", err)
	}
	if _, err := b.States.Put(ctx, state.Key{Namespace: b.Namespace, Stack: "a/b", Workspace: "x"}, data, state.PutOptions{}); err == nil {
		t.Fatal("a key with a slash was accepted")
	}
}

func wantConflict(t *testing.T, err error, reason state.ConflictReason) {
	t.Helper()
	var c *state.ConflictError
	if !errors.As(err, &c) || c.Reason != reason {
		t.Fatalf("got %v, want a ConflictError %s", err, reason)
	}
}

func testSerialAndLineage(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "serials", Workspace: "default"}
	mustPut(t, b.States, key, StateJSON("lin-a", 5, 0, 100), state.PutOptions{})
	_, err := b.States.Put(ctx, key, StateJSON("lin-a", 4, 0, 100), state.PutOptions{})
	wantConflict(t, err, state.ConflictSerial)
	_, err = b.States.Put(ctx, key, StateJSON("lin-b", 6, 0, 100), state.PutOptions{})
	wantConflict(t, err, state.ConflictLineage)
	if c := new(state.ConflictError); errors.As(err, &c) && (c.Stored != "lin-a" || c.Offered != "lin-b") {
		t.Fatalf("lineage conflict names %q/%q", c.Stored, c.Offered)
	}
	mustPut(t, b.States, key, StateJSON("lin-a", 5, 1, 100), state.PutOptions{}) // same serial is allowed
	mustPut(t, b.States, key, StateJSON("lin-a", 6, 2, 100), state.PutOptions{})
	meta := mustPut(t, b.States, key, StateJSON("lin-b", 1, 3, 100), state.PutOptions{Force: true})
	if meta.Lineage != "lin-b" || meta.Serial != 1 || meta.Version != 4 {
		t.Fatalf("forced put returned %+v", meta)
	}
}

func mustPut(t *testing.T, s state.Store, key state.Key, data []byte, opts state.PutOptions) state.StateMeta {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	meta, err := s.Put(ctx, key, data, opts)
	if err != nil {
		t.Fatalf("Put %s: %v", key, err)
	}
	return meta
}

func testCompareAndSwap(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "cas", Workspace: "default"}
	v1 := mustPut(t, b.States, key, StateJSON("l", 1, 0, 100), state.PutOptions{IfMatch: state.Absent})
	_, err := b.States.Put(ctx, key, StateJSON("l", 2, 0, 100), state.PutOptions{IfMatch: state.Absent})
	wantConflict(t, err, state.ConflictVersion)
	v2 := mustPut(t, b.States, key, StateJSON("l", 2, 0, 100), state.PutOptions{IfMatch: v1.Version})
	_, err = b.States.Put(ctx, key, StateJSON("l", 3, 0, 100), state.PutOptions{IfMatch: v1.Version})
	wantConflict(t, err, state.ConflictVersion)
	if v2.Version != v1.Version+1 {
		t.Fatalf("versions %d then %d", v1.Version, v2.Version)
	}
	got, err := b.States.Get(ctx, key)
	if err != nil || got.Version != v2.Version || got.Serial != 2 {
		t.Fatalf("after a refused write: %+v, %v", got, err)
	}
}

func testHistory(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "hist", Workspace: "default"}
	var written [][]byte
	total := b.History + 2
	for i := 1; i <= total; i++ {
		data := StateJSON("l", int64(i), i, 1000)
		written = append(written, data)
		mustPut(t, b.States, key, data, state.PutOptions{})
	}
	versions, err := b.States.ListVersions(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != b.History {
		t.Fatalf("kept %d versions, want %d", len(versions), b.History)
	}
	for i, v := range versions {
		want := state.Version(total - i)
		if v.Version != want || v.Serial != int64(want) {
			t.Fatalf("version %d is %+v, want version and serial %d (newest first)", i, v, want)
		}
		got, err := b.States.GetVersion(ctx, key, v.Version)
		if err != nil {
			t.Fatalf("GetVersion %d: %v", v.Version, err)
		}
		if !bytes.Equal(got.Data, written[want-1]) {
			t.Fatalf("GetVersion %d returned other bytes", v.Version)
		}
	}
	if _, err := b.States.GetVersion(ctx, key, 1); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("a version past the history limit: got %v, want ErrNotFound", err)
	}
}

func testLocks(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "locks", Workspace: "default"}
	a := state.LockInfo{ID: "lock-a", Operation: "OperationTypeApply", Who: "runner-a@host", Version: "1.12.6", Created: time.Now().UTC().Truncate(time.Second), Path: "x"}
	if err := b.States.Lock(ctx, key, a); err != nil {
		t.Fatalf("Lock before any state: %v", err)
	}
	if err := b.States.Lock(ctx, key, a); err != nil {
		t.Fatalf("taking the held lock again with the same ID: %v", err)
	}
	err := b.States.Lock(ctx, key, state.LockInfo{ID: "lock-b", Who: "runner-b"})
	var locked *state.LockedError
	if !errors.As(err, &locked) || locked.Holder == nil {
		t.Fatalf("second Lock: got %v, want a LockedError with the holder", err)
	}
	if h := locked.Holder; h.ID != a.ID || h.Who != a.Who || h.Operation != a.Operation || h.Version != a.Version || !h.Created.Equal(a.Created) {
		t.Fatalf("holder reported as %+v, want %+v", *h, a)
	}
	held, err := b.States.GetLock(ctx, key)
	if err != nil || held == nil || held.ID != a.ID {
		t.Fatalf("GetLock: %+v, %v", held, err)
	}
	data := StateJSON("l", 1, 0, 100)
	if _, err := b.States.Put(ctx, key, data, state.PutOptions{}); !errors.As(err, &locked) {
		t.Fatalf("Put without the lock ID on a locked state: got %v", err)
	}
	if _, err := b.States.Put(ctx, key, data, state.PutOptions{LockID: "lock-b"}); !errors.As(err, &locked) {
		t.Fatalf("Put with another lock ID: got %v", err)
	}
	mustPut(t, b.States, key, data, state.PutOptions{LockID: a.ID})
	if err := b.States.Unlock(ctx, key, "lock-b"); !errors.As(err, &locked) {
		t.Fatalf("Unlock with another ID: got %v", err)
	}
	if err := b.States.Unlock(ctx, key, a.ID); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if err := b.States.Unlock(ctx, key, a.ID); err != nil {
		t.Fatalf("Unlock of an unlocked state: %v", err)
	}
	_, err = b.States.Put(ctx, key, StateJSON("l", 2, 0, 100), state.PutOptions{LockID: a.ID})
	if !errors.As(err, &locked) || locked.Holder != nil {
		t.Fatalf("Put naming a released lock: got %v, want a LockedError without holder", err)
	}
	if err := b.States.Lock(ctx, key, state.LockInfo{ID: "lock-c", Who: "dead runner"}); err != nil {
		t.Fatal(err)
	}
	if err := b.States.ForceUnlock(ctx, key); err != nil {
		t.Fatalf("ForceUnlock: %v", err)
	}
	if held, err := b.States.GetLock(ctx, key); err != nil || held != nil {
		t.Fatalf("after ForceUnlock: %+v, %v", held, err)
	}
	mustPut(t, b.States, key, StateJSON("l", 2, 0, 100), state.PutOptions{})
}

func testDeleteAndList(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	keys := []state.Key{
		{Namespace: b.Namespace, Stack: "one", Workspace: "default"},
		{Namespace: b.Namespace, Stack: "one", Workspace: "staging"},
		{Namespace: b.Namespace, Stack: "a-stack-name-that-is-rather-long-" + fmt.Sprint(len(b.Namespace)) + "-and-goes-past-sixty-three-characters", Workspace: "Weird_Workspace"},
	}
	for _, k := range keys {
		mustPut(t, b.States, k, StateJSON("l", 1, 0, 100), state.PutOptions{})
		mustPut(t, b.States, k, StateJSON("l", 2, 0, 100), state.PutOptions{})
	}
	listed, err := b.States.List(ctx, b.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if !sameKeys(listed, keys) {
		t.Fatalf("List returned %v, want %v", listed, keys)
	}
	if err := b.States.Lock(ctx, keys[0], state.LockInfo{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := b.States.Delete(ctx, keys[0]); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := b.States.Delete(ctx, keys[0]); err != nil {
		t.Fatalf("Delete of a deleted state: %v", err)
	}
	if _, err := b.States.Get(ctx, keys[0]); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	if lock, err := b.States.GetLock(ctx, keys[0]); err != nil || lock != nil {
		t.Fatalf("lock after Delete: %+v, %v", lock, err)
	}
	if got, err := b.States.Get(ctx, keys[1]); err != nil || got.Serial != 2 {
		t.Fatalf("Delete touched another workspace: %v", err)
	}
	listed, err = b.States.List(ctx, b.Namespace)
	if err != nil || !sameKeys(listed, keys[1:]) {
		t.Fatalf("List after Delete returned %v, %v", listed, err)
	}
	if meta := mustPut(t, b.States, keys[0], StateJSON("new", 1, 0, 100), state.PutOptions{IfMatch: state.Absent}); meta.Version != 1 {
		t.Fatalf("Put after Delete got version %d", meta.Version)
	}

	// DeleteStack removes every workspace and plan of one Stack only.
	if _, err := b.Plans.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: b.Namespace, Stack: "one", ID: "p"}}, Binary: []byte("plan")}); err != nil {
		t.Fatal(err)
	}
	if err := state.DeleteStack(ctx, b.States, b.Plans, b.Namespace, "one"); err != nil {
		t.Fatalf("DeleteStack: %v", err)
	}
	listed, err = b.States.List(ctx, b.Namespace)
	if err != nil || !sameKeys(listed, keys[2:]) {
		t.Fatalf("List after DeleteStack returned %v, %v", listed, err)
	}
	if plans, err := b.Plans.ListPlans(ctx, b.Namespace, "one"); err != nil || len(plans) != 0 {
		t.Fatalf("plans after DeleteStack: %v, %v", plans, err)
	}
}

func sameKeys(a, b []state.Key) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[state.Key]int{}
	for _, k := range a {
		seen[k]++
	}
	for _, k := range b {
		seen[k]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}
