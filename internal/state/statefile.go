package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Header is what a Store reads from a state JSON: OpenTofu's serial and lineage.
type Header struct {
	Serial  int64  `json:"serial"`
	Lineage string `json:"lineage"`
}

// ParseHeader reads serial and lineage from a state JSON object (plain or
// OpenTofu-encrypted: both carry them at the top level).
func ParseHeader(data []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(data, &h); err != nil {
		// The decoder's message may quote input; report only the position-free kind.
		return Header{}, fmt.Errorf("%w: not a JSON object with serial and lineage", ErrInvalidState)
	}
	if h.Serial < 0 {
		return Header{}, fmt.Errorf("%w: negative serial", ErrInvalidState)
	}
	return h, nil
}

// CheckSuccessor applies OpenTofu's rules to a write of next over current:
// the serial may not go down and the lineage may not change. Force skips both.
func CheckSuccessor(key string, current *StateMeta, next Header, force bool) error {
	if current == nil || force {
		return nil
	}
	if current.Lineage != "" && next.Lineage != "" && current.Lineage != next.Lineage {
		return &ConflictError{Reason: ConflictLineage, Key: key, Stored: current.Lineage, Offered: next.Lineage}
	}
	if next.Serial < current.Serial {
		return &ConflictError{Reason: ConflictSerial, Key: key, Stored: strconv.FormatInt(current.Serial, 10), Offered: strconv.FormatInt(next.Serial, 10)}
	}
	return nil
}

// CheckVersion applies PutOptions.IfMatch against the current version (0 when absent).
func CheckVersion(key string, current Version, ifMatch Version) error {
	switch {
	case ifMatch == AnyVersion:
		return nil
	case ifMatch == Absent && current == 0:
		return nil
	case ifMatch == current:
		return nil
	}
	offered := strconv.FormatInt(int64(ifMatch), 10)
	if ifMatch == Absent {
		offered = "none (create)"
	}
	stored := strconv.FormatInt(int64(current), 10)
	if current == 0 {
		stored = "none"
	}
	return &ConflictError{Reason: ConflictVersion, Key: key, Stored: stored, Offered: offered}
}

// CheckLock applies the lock rules of a write or unlock naming lockID to
// the held lock. A lockID made by OwnedLockID also requires the lock to
// have been taken by its owner.
func CheckLock(key string, held *LockInfo, lockID string) error {
	id, owner, owned := splitOwnedLockID(lockID)
	if held == nil {
		if id != "" {
			return &LockedError{Key: key, Offered: id}
		}
		return nil
	}
	if held.ID != id || (owned && held.Owner != owner) {
		h := *held
		return &LockedError{Key: key, Holder: &h, Offered: id}
	}
	return nil
}

// ownerSeparator joins a lock ID and its owner in OwnedLockID.
const ownerSeparator = "\x00owner="

// OwnedLockID is the lock ID to pass to Put (PutOptions.LockID) or Unlock
// when the lock must not only have id but also have been taken by owner
// (LockInfo.Owner): the state server passes a runner's lock IDs so, and
// the store checks both in the same compare-and-swap or transaction as the
// write, so no read of the lock is needed before it. An empty id or owner
// returns id unchanged.
func OwnedLockID(owner, id string) string {
	if id == "" || owner == "" {
		return id
	}
	return id + ownerSeparator + owner
}

// splitOwnedLockID undoes OwnedLockID. The owner follows the last
// separator, so an id that itself contains one cannot name another owner.
func splitOwnedLockID(lockID string) (id, owner string, owned bool) {
	i := strings.LastIndex(lockID, ownerSeparator)
	if i < 0 {
		return lockID, "", false
	}
	return lockID[:i], lockID[i+len(ownerSeparator):], true
}

// SameLock says whether held is the lock info offers to take again: the
// same ID, taken by the same owner. Lock succeeds without a change then.
func SameLock(held *LockInfo, offered LockInfo) bool {
	return held != nil && held.ID == offered.ID && held.Owner == offered.Owner
}

// Digest returns "sha256:<hex>" of data.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
