package state

import (
	"errors"
	"fmt"
)

// ErrNotFound is matched (errors.Is) by every "no such state, version or plan" error.
var ErrNotFound = errors.New("not found")

// ErrMigrated is matched by writes and locks refused because the entry was
// migrated to another backend.
var ErrMigrated = errors.New("migrated to another backend")

// ErrInvalidState is matched when the bytes given to Put are not a state JSON object.
var ErrInvalidState = errors.New("invalid state")

// ConflictReason says why a write was refused.
type ConflictReason string

const (
	// ConflictVersion: the state changed since the caller read it (IfMatch).
	ConflictVersion ConflictReason = "VersionMismatch"
	// ConflictSerial: the new state's serial is lower than the stored one.
	ConflictSerial ConflictReason = "SerialRegression"
	// ConflictLineage: the new state belongs to another lineage.
	ConflictLineage ConflictReason = "LineageMismatch"
	// ConflictPlan: a plan with this id exists with other contents.
	ConflictPlan ConflictReason = "PlanExists"
	// ConflictExists: a record with this id exists already.
	ConflictExists ConflictReason = "AlreadyExists"
)

// ConflictError is a write refused because it does not follow from what is
// stored. It names numbers and ids, never state contents.
type ConflictError struct {
	Reason ConflictReason
	// Key of the refused write, as text (namespace/stack/workspace or plan key).
	Key string
	// Stored and Offered describe both sides in Reason's terms: versions,
	// serials or lineages.
	Stored  string
	Offered string
}

func (e *ConflictError) Error() string {
	switch e.Reason {
	case ConflictVersion:
		return fmt.Sprintf("state %s changed: it is at version %s, the write expected version %s; read it again and retry", e.Key, e.Stored, e.Offered)
	case ConflictSerial:
		return fmt.Sprintf("state %s refused: serial %s is lower than the stored serial %s; pull the latest state first", e.Key, e.Offered, e.Stored)
	case ConflictLineage:
		return fmt.Sprintf("state %s refused: lineage %q differs from the stored lineage %q; this state belongs to another workspace or was recreated", e.Key, e.Offered, e.Stored)
	case ConflictPlan:
		return fmt.Sprintf("plan %s exists with other contents (stored %s, offered %s)", e.Key, e.Stored, e.Offered)
	default:
		return fmt.Sprintf("%s %s (stored %s, offered %s)", e.Reason, e.Key, e.Stored, e.Offered)
	}
}

// LockedError is an operation refused because of the lock: it is held by
// someone else (Holder set) or, for a write or unlock naming a lock ID, no
// lock is held (Holder nil).
type LockedError struct {
	Key string
	// Holder is the lock currently held, nil when none is.
	Holder *LockInfo
	// Offered is the lock ID the refused operation named ("" when none).
	Offered string
}

func (e *LockedError) Error() string {
	if e.Holder == nil {
		return fmt.Sprintf("state %s is not locked, but the request names lock %q: the lock was released or force-unlocked", e.Key, e.Offered)
	}
	return fmt.Sprintf("state %s is locked by %q (operation %q, by %q, since %s)", e.Key, e.Holder.ID, e.Holder.Operation, e.Holder.Who, e.Holder.Created.UTC().Format("2006-01-02T15:04:05Z"))
}

// CorruptError reports stored data that fails verification: a missing chunk,
// a digest mismatch, undecryptable or undecompressable bytes.
type CorruptError struct {
	// What names the damaged object (a Secret name, a table row).
	What   string
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("stored data is corrupt: %s: %s", e.What, e.Reason)
}

// MigratedError is a write refused because the entry moved elsewhere; it matches [ErrMigrated].
type MigratedError struct {
	Key  string
	Mark MigrationMark
}

func (e *MigratedError) Error() string {
	return fmt.Sprintf("%s was migrated to the %s backend at %s; use that backend (or migrate back) to change it", e.Key, e.Mark.To, e.Mark.At.UTC().Format("2006-01-02T15:04:05Z"))
}

// Is makes errors.Is(err, ErrMigrated) true.
func (e *MigratedError) Is(target error) bool { return target == ErrMigrated }

// NotFoundError names what was not found; it matches [ErrNotFound].
type NotFoundError struct{ What string }

func (e *NotFoundError) Error() string { return e.What + " not found" }

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }
