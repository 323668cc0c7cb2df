package state

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultHistory is how many state versions a Store keeps per Key when not told.
const DefaultHistory = 10

// DefaultWorkspace is OpenTofu's default workspace name.
const DefaultWorkspace = "default"

// Key names the state of one workspace of one Stack.
type Key struct {
	Namespace string
	Stack     string
	Workspace string
}

// String renders the key as namespace/stack/workspace, as the state server's path does.
func (k Key) String() string { return k.Namespace + "/" + k.Stack + "/" + k.Workspace }

// Validate checks that every part is set and printable, without slashes.
func (k Key) Validate() error {
	for _, p := range []struct{ name, value string }{{"namespace", k.Namespace}, {"stack", k.Stack}, {"workspace", k.Workspace}} {
		if err := validatePart(p.name, p.value); err != nil {
			return err
		}
	}
	return nil
}

func validatePart(name, value string) error {
	if value == "" {
		return fmt.Errorf("%s must not be empty", name)
	}
	if len(value) > 253 {
		return fmt.Errorf("%s is longer than 253 characters", name)
	}
	for _, r := range value {
		if r == '/' || r < 0x21 || r == 0x7f {
			return fmt.Errorf("%s %q contains a slash, a space or a control character", name, value)
		}
	}
	return nil
}

// Version numbers the writes of one Key: 1 for the first Put, +1 for each
// following one. It is the compare-and-swap token of [PutOptions.IfMatch].
// After [Store.Delete] numbering starts again at 1.
type Version int64

const (
	// AnyVersion (the zero value) puts without a version precondition;
	// the serial, lineage and lock rules still apply.
	AnyVersion Version = 0
	// Absent makes Put succeed only when the Key has no state yet.
	Absent Version = -1
)

// StateMeta describes one stored state version, without its bytes.
type StateMeta struct {
	Key     Key
	Version Version
	// Serial and Lineage as read from the state JSON.
	Serial  int64
	Lineage string
	// Digest is "sha256:<hex>" of the state bytes exactly as put.
	Digest string
	// Size is the length of the state bytes.
	Size      int64
	CreatedAt time.Time
}

// State is one state version with its bytes.
type State struct {
	StateMeta
	Data []byte
}

// PutOptions are the preconditions of [Store.Put].
type PutOptions struct {
	// IfMatch is the Version the caller read; the Put fails with a
	// [*ConflictError] when the current Version differs. [AnyVersion] skips
	// the check, [Absent] requires that no state exists.
	IfMatch Version
	// LockID must be the ID of the held lock when the Key is locked. When a
	// LockID is given and no lock (or another one) is held, Put fails.
	LockID string
	// Force skips the serial and lineage rules (an operator's explicit
	// override, like `tofu state push -force`). Version and lock rules stay.
	Force bool
}

// LockInfo is the lock record of the Terraform/OpenTofu lock protocol; its
// JSON is what tofu sends to LOCK and expects back in a 423.
type LockInfo struct {
	ID        string    `json:"ID"`
	Operation string    `json:"Operation"`
	Info      string    `json:"Info"`
	Who       string    `json:"Who"`
	Version   string    `json:"Version"`
	Created   time.Time `json:"Created"`
	Path      string    `json:"Path"`
	// Owner is the Terrace identity that took the lock through the state
	// server (set by the server, never taken from the client): a runner may
	// release or write under only a lock it owns. Empty for locks taken
	// directly on the store (migrations, the controller).
	Owner string `json:"Owner,omitempty"`
}

// MigrationMark says that an entry was copied to another backend and
// verified there; the entry is kept but refuses new writes and locks.
type MigrationMark struct {
	// To names the backend the entry moved to ("secrets" or "postgres").
	To string    `json:"to"`
	At time.Time `json:"at"`
}

// Store keeps the state of every Key. Implementations are safe for
// concurrent use, also from several processes: concurrency control lives in
// the storage (resourceVersion, transactions), never in memory.
type Store interface {
	// Get returns the current state, or an error matching [ErrNotFound].
	// A missing or corrupt chunk is a [*CorruptError], never a short state.
	Get(ctx context.Context, key Key) (*State, error)
	// Put stores data as the new current state and returns its metadata.
	// It refuses, with a [*ConflictError], a changed Version (IfMatch), a
	// serial lower than the current one and a different lineage (unless
	// Force); with a [*LockedError] a Key locked by someone else; with
	// [ErrMigrated] a Key marked migrated. data must be a state JSON object.
	Put(ctx context.Context, key Key, data []byte, opts PutOptions) (StateMeta, error)
	// Delete removes the state, its history, its lock and its migration mark.
	// A missing Key is not an error.
	Delete(ctx context.Context, key Key) error
	// ListVersions returns the kept versions, newest first (the current one first).
	ListVersions(ctx context.Context, key Key) ([]StateMeta, error)
	// GetVersion returns one kept version, or an error matching [ErrNotFound].
	GetVersion(ctx context.Context, key Key, version Version) (*State, error)

	// Lock takes the lock for info.ID. Taking a lock already held with the
	// same ID succeeds; a lock held by another ID is a [*LockedError] with
	// the holder's info. A Key may be locked before it has any state.
	Lock(ctx context.Context, key Key, info LockInfo) error
	// Unlock releases the lock held with id. No lock is not an error; a
	// lock held by another ID is a [*LockedError].
	Unlock(ctx context.Context, key Key, id string) error
	// ForceUnlock releases whatever lock is held.
	ForceUnlock(ctx context.Context, key Key) error
	// GetLock returns the held lock, or nil when the Key is unlocked.
	GetLock(ctx context.Context, key Key) (*LockInfo, error)

	// List returns every Key that has a state, a lock or a mark, in one
	// namespace or, with "", in all.
	List(ctx context.Context, namespace string) ([]Key, error)
	// ReplaceHistory makes versions (oldest first, as returned by
	// GetVersion, with their Version numbers and times) the complete history
	// of key, dropping what was there and clearing any migration mark. It is
	// for migration: the usual Put rules do not apply, a held lock does.
	ReplaceHistory(ctx context.Context, key Key, versions []State) error
	// Migrated returns the migration mark of key, or nil.
	Migrated(ctx context.Context, key Key) (*MigrationMark, error)
	// MarkMigrated sets (or with nil clears) the migration mark of key.
	MarkMigrated(ctx context.Context, key Key, mark *MigrationMark) error
}

// AdmittingGetter is a Store that reads the current state with one read
// of its metadata: admit is called with the state's metadata (its size)
// before the bytes are loaded, and an error from it ends the read. The
// state server admits large states into its memory budget so.
type AdmittingGetter interface {
	GetAdmitted(ctx context.Context, key Key, admit func(StateMeta) error) (*State, error)
}

// GetAdmitted reads the current state of key from s, calling admit before
// the bytes are loaded: in one read of the metadata when s is an
// AdmittingGetter, else with ListVersions and Get. No state is an error
// matching [ErrNotFound].
func GetAdmitted(ctx context.Context, s Store, key Key, admit func(StateMeta) error) (*State, error) {
	if g, ok := s.(AdmittingGetter); ok {
		return g.GetAdmitted(ctx, key, admit)
	}
	versions, err := s.ListVersions(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(versions) == 0 {
		return nil, &NotFoundError{What: "state " + key.String()}
	}
	if err := admit(versions[0]); err != nil {
		return nil, err
	}
	return s.Get(ctx, key)
}

// DeleteStack removes every state (all workspaces, with history and locks)
// and every saved plan of a Stack, e.g. when the Stack is deleted. The
// stores set no owner references, so this is the way to clean up; release
// records go with release.History.DeleteAll.
func DeleteStack(ctx context.Context, states Store, plans PlanStore, namespace, stack string) error {
	keys, err := states.List(ctx, namespace)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.Stack != stack {
			continue
		}
		if err := states.Delete(ctx, k); err != nil {
			return fmt.Errorf("failed to delete state %s: %w", k, err)
		}
	}
	metas, err := plans.ListPlans(ctx, namespace, stack)
	if err != nil {
		return err
	}
	for _, m := range metas {
		if err := plans.DeletePlan(ctx, m.Key); err != nil {
			return fmt.Errorf("failed to delete plan %s: %w", m.Key, err)
		}
	}
	return nil
}

// SizeHinter is a Store that can say, without a request, how large a
// state was when it last read or wrote it. The hint may be stale (another
// replica may have written since); callers use it only to choose between
// two correct ways of working, never for correctness.
type SizeHinter interface {
	LastKnownSize(key Key) (size int64, known bool)
}

// LastKnownSize asks s for a size hint; known is false when s keeps none
// or has none for key.
func LastKnownSize(s Store, key Key) (size int64, known bool) {
	if h, ok := s.(SizeHinter); ok {
		return h.LastKnownSize(key)
	}
	return 0, false
}

// LockHolderReader is a Store that may answer from its own copy of what a
// run's apply lock left, without reading the index: the run's reads under
// that lock, and the state once the lock was released. ok false: no copy
// answers.
type LockHolderReader interface {
	GetUnderOwnLock(ctx context.Context, key Key, owner string, admit func(StateMeta) error) (st *State, ok bool, err error)
	StateAfterApply(ctx context.Context, key Key, owner string) (st *State, ok bool)
}

// ApplyOperation is the LockInfo.Operation of tofu's apply (and of a
// one-process plan-and-apply): the one lock cycle of a run that writes the
// state.
const ApplyOperation = "OperationTypeApply"

// GetAdmittedBy is GetAdmitted for a reader (owner, a lock owner's name)
// that may hold key's lock. admit is called at most once.
func GetAdmittedBy(ctx context.Context, s Store, key Key, owner string, admit func(StateMeta) error) (*State, error) {
	admitted := false
	once := func(m StateMeta) error {
		if admitted {
			return nil
		}
		admitted = true
		return admit(m)
	}
	if r, ok := s.(LockHolderReader); ok && owner != "" {
		if st, ok, err := r.GetUnderOwnLock(ctx, key, owner, once); ok {
			return st, err
		}
	}
	return GetAdmitted(ctx, s, key, once)
}

// StateAfterApply reads the state as the run owner left it once its apply
// lock was released: from s's own copy when s released it, otherwise the
// current state.
func StateAfterApply(ctx context.Context, s Store, key Key, owner string) (*State, error) {
	if r, ok := s.(LockHolderReader); ok {
		if st, ok := r.StateAfterApply(ctx, key, owner); ok {
			return st, nil
		}
	}
	return s.Get(ctx, key)
}

// PutAndRelease writes data as key's current state under holder, the lock
// held now (nil for none), with its owner's ID, then releases that lock:
// a write on behalf of a run whose own upload and lock release got no
// answer. The caller decides that holder may be written under. A state
// already current (only the answer to its upload was lost) is not written
// again. The store's rules stand: another lineage, or a serial not above
// the stored one, is refused and the lock kept.
func PutAndRelease(ctx context.Context, s Store, key Key, data []byte, holder *LockInfo) (StateMeta, error) {
	var lockID string
	if holder != nil {
		lockID = OwnedLockID(holder.Owner, holder.ID)
	}
	current, err := s.Get(ctx, key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return StateMeta{}, err
	}
	meta := StateMeta{}
	if current != nil {
		meta = current.StateMeta
	}
	if current == nil || current.Digest != Digest(data) {
		if meta, err = s.Put(ctx, key, data, PutOptions{LockID: lockID}); err != nil {
			return StateMeta{}, err
		}
	}
	if lockID != "" {
		if err := s.Unlock(ctx, key, lockID); err != nil {
			return meta, &ReleaseError{Lock: *holder, Err: err}
		}
	}
	return meta, nil
}

// ReleaseError is PutAndRelease's state written but its lock not released.
type ReleaseError struct {
	Lock LockInfo
	Err  error
}

func (e *ReleaseError) Error() string {
	return fmt.Sprintf("the state was written, but lock %s could not be released: %v", e.Lock.ID, e.Err)
}

func (e *ReleaseError) Unwrap() error { return e.Err }
