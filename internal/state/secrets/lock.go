package secrets

import (
	"context"
	"fmt"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
)

// Lock implements state.Store.
func (s *Store) Lock(ctx context.Context, key state.Key, info state.LockInfo) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if info.ID == "" {
		return fmt.Errorf("lock info for %s has no ID", key)
	}
	if info.Created.IsZero() {
		info.Created = time.Now().UTC()
	}
	var taken *indexObject
	err := s.updateIndex(ctx, key, nil, func(x *indexObject) error {
		taken = nil
		if x.mark != nil {
			return &state.MigratedError{Key: "state " + key.String(), Mark: *x.mark}
		}
		if x.lock != nil {
			if state.SameLock(x.lock, info) {
				return errUnchanged
			}
			h := *x.lock
			return &state.LockedError{Key: key.String(), Holder: &h, Offered: info.ID}
		}
		x.lock, taken = &info, x
		return nil
	})
	if err == nil && taken != nil && taken.obj != nil {
		s.indexes.markLock(indexKey(key), info.Owner, false, taken.obj)
	}
	return err
}

// Unlock implements state.Store.
func (s *Store) Unlock(ctx context.Context, key state.Key, id string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	var freed *indexObject
	var held state.LockInfo
	err := s.updateIndex(ctx, key, nil, func(x *indexObject) error {
		freed = nil
		if x.lock == nil {
			return errUnchanged
		}
		if err := state.CheckLock(key.String(), x.lock, id); err != nil {
			return err
		}
		held, freed = *x.lock, x
		x.lock = nil
		return nil
	})
	// The release of a run's apply lock, the run's last write, leaves the
	// state as the run left it (StateAfterApply).
	if err == nil && freed != nil && freed.obj != nil && held.Operation == state.ApplyOperation {
		s.indexes.markLock(indexKey(key), held.Owner, true, freed.obj)
	}
	return err
}

// ForceUnlock implements state.Store.
func (s *Store) ForceUnlock(ctx context.Context, key state.Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	return s.updateIndex(ctx, key, nil, func(x *indexObject) error {
		if x.lock == nil {
			return errUnchanged
		}
		x.lock = nil
		return nil
	})
}

// GetLock implements state.Store.
func (s *Store) GetLock(ctx context.Context, key state.Key) (*state.LockInfo, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	x, err := s.loadIndex(ctx, key)
	if err != nil {
		return nil, err
	}
	return x.lock, nil
}

// Migrated implements state.Store.
func (s *Store) Migrated(ctx context.Context, key state.Key) (*state.MigrationMark, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	x, err := s.loadIndex(ctx, key)
	if err != nil {
		return nil, err
	}
	return x.mark, nil
}

// MarkMigrated implements state.Store.
func (s *Store) MarkMigrated(ctx context.Context, key state.Key, mark *state.MigrationMark) error {
	if err := key.Validate(); err != nil {
		return err
	}
	return s.updateIndex(ctx, key, nil, func(x *indexObject) error {
		if x.obj.ResourceVersion == "" {
			if mark == nil {
				return errUnchanged
			}
			return &state.NotFoundError{What: "state " + key.String()}
		}
		x.mark = mark
		return nil
	})
}

// ReplaceHistory implements state.Store.
func (s *Store) ReplaceHistory(ctx context.Context, key state.Key, versions []state.State) error {
	if err := key.Validate(); err != nil {
		return err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	headers := make([]state.Header, len(versions))
	for i, v := range versions {
		if headers[i], err = state.ParseHeader(v.Data); err != nil {
			return fmt.Errorf("version %d: %w", v.Version, err)
		}
	}
	writeID := newWriteID()
	entries := make([]versionEntry, 0, len(versions))
	var written []chunkRef
	cleanup := func() { s.deleteChunks(context.WithoutCancel(ctx), key.Namespace, written) }
	inlineUsed := 0
	// Newest first, as the index keeps them: the newest get the index's
	// room for inline versions.
	for i := len(versions) - 1; i >= 0; i-- {
		v := versions[i]
		sealed, encoding, err := state.SealFor(v.Data, encKey, state.StateBinding(key, v.Version))
		if err != nil {
			cleanup()
			return err
		}
		blob, err := s.stateBlob(ctx, key, sealed, encoding, s.inlineLimit(inlineUsed), fmt.Sprintf("%s-v%d", writeID, v.Version))
		if err != nil {
			cleanup()
			return err
		}
		inlineUsed += len(blob.Inline)
		written = append(written, blob.Chunks...)
		entries = append(entries, versionEntry{Version: int64(v.Version), Serial: headers[i].Serial, Lineage: headers[i].Lineage, Digest: state.Digest(v.Data), Size: int64(len(v.Data)), CreatedAt: v.CreatedAt.UTC().Truncate(time.Microsecond), Blob: blob})
	}
	var replaced []versionEntry
	err = s.updateIndex(ctx, key, nil, func(x *indexObject) error {
		if x.lock != nil {
			h := *x.lock
			return &state.LockedError{Key: key.String(), Holder: &h}
		}
		replaced = x.index.Versions
		x.index.Versions = entries
		x.index.NextVersion = 1
		if len(entries) > 0 {
			x.index.NextVersion = entries[0].Version + 1
		}
		x.mark = nil
		return nil
	})
	if err != nil {
		// Only a write refused before the index was saved may delete its
		// chunks: a saved index whose answer was lost names them.
		if refusedBeforeSave(err) {
			cleanup()
		}
		return err
	}
	for _, e := range replaced {
		s.deleteChunks(ctx, key.Namespace, e.Blob.Chunks)
	}
	return nil
}
