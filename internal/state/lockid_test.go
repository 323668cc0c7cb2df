package state_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
)

// A lock ID that names its owner opens only a lock of that ID taken by
// that owner, also when the ID itself tries to name another owner.
func TestOwnedLockIDChecksIDAndOwner(t *testing.T) {
	held := &state.LockInfo{ID: "abc", Owner: "terrace://runner/ns/app/run-1"}
	for _, tc := range []struct {
		name   string
		lockID string
		ok     bool
	}{
		{"plain id", "abc", true},
		{"owned by the holder", state.OwnedLockID("terrace://runner/ns/app/run-1", "abc"), true},
		{"owned by another run", state.OwnedLockID("terrace://runner/ns/app/run-2", "abc"), false},
		{"another id", state.OwnedLockID("terrace://runner/ns/app/run-1", "abd"), false},
		{"id naming the holder inside", state.OwnedLockID("terrace://runner/ns/app/run-2", state.OwnedLockID("terrace://runner/ns/app/run-1", "abc")), false},
		{"no id", "", false},
	} {
		err := state.CheckLock("ns/app/default", held, tc.lockID)
		var locked *state.LockedError
		if tc.ok != (err == nil) || (err != nil && !errors.As(err, &locked)) {
			t.Errorf("%s: CheckLock = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if locked != nil && strings.Contains(locked.Offered, "terrace://runner/ns/app/run-2") {
			t.Errorf("%s: the error's offered ID carries the owner: %q", tc.name, locked.Offered)
		}
	}
	if err := state.CheckLock("k", nil, state.OwnedLockID("o", "abc")); err == nil {
		t.Error("an owned lock ID passed with no lock held")
	}
	if err := state.CheckLock("k", nil, state.OwnedLockID("o", "")); err != nil {
		t.Errorf("no lock ID with no lock held: %v", err)
	}
	if !state.SameLock(held, *held) || state.SameLock(held, state.LockInfo{ID: "abc", Owner: "other"}) {
		t.Error("SameLock must compare the ID and the owner")
	}
}
