package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/terrace-dev/terrace/internal/state"
)

func setLock(ctx context.Context, tx pgx.Tx, key state.Key, info *state.LockInfo) error {
	raw, err := encodeJSON(info)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE terrace_state_heads SET lock_info=$4::jsonb WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace, raw); err != nil {
		return fmt.Errorf("failed to write the lock of %s: %w", key, err)
	}
	return nil
}

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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		h, err := lockHead(ctx, tx, key, true)
		if err != nil {
			return err
		}
		if h.mark != nil {
			return &state.MigratedError{Key: "state " + key.String(), Mark: *h.mark}
		}
		if h.lock != nil {
			if state.SameLock(h.lock, info) {
				return nil
			}
			return &state.LockedError{Key: key.String(), Holder: h.lock, Offered: info.ID}
		}
		return setLock(ctx, tx, key, &info)
	})
}

// Unlock implements state.Store.
func (s *Store) Unlock(ctx context.Context, key state.Key, id string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		h, err := lockHead(ctx, tx, key, false)
		if err != nil || h.lock == nil {
			return err
		}
		if err := state.CheckLock(key.String(), h.lock, id); err != nil {
			return err
		}
		return setLock(ctx, tx, key, nil)
	})
}

// ForceUnlock implements state.Store.
func (s *Store) ForceUnlock(ctx context.Context, key state.Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `UPDATE terrace_state_heads SET lock_info=NULL WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace); err != nil {
		return fmt.Errorf("failed to force-unlock %s: %w", key, err)
	}
	return nil
}

// GetLock implements state.Store.
func (s *Store) GetLock(ctx context.Context, key state.Key) (*state.LockInfo, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT lock_info FROM terrace_state_heads WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the lock of %s: %w", key, err)
	}
	return decodeJSON[state.LockInfo](raw, "lock of state "+key.String())
}

// Migrated implements state.Store.
func (s *Store) Migrated(ctx context.Context, key state.Key) (*state.MigrationMark, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT migrated FROM terrace_state_heads WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the migration mark of %s: %w", key, err)
	}
	return decodeJSON[state.MigrationMark](raw, "migration mark of state "+key.String())
}

// MarkMigrated implements state.Store.
func (s *Store) MarkMigrated(ctx context.Context, key state.Key, mark *state.MigrationMark) error {
	if err := key.Validate(); err != nil {
		return err
	}
	raw, err := encodeJSON(mark)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE terrace_state_heads SET migrated=$4::jsonb WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace, raw)
	if err != nil {
		return fmt.Errorf("failed to mark %s migrated: %w", key, err)
	}
	if tag.RowsAffected() == 0 && mark != nil {
		return &state.NotFoundError{What: "state " + key.String()}
	}
	return nil
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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		h, err := lockHead(ctx, tx, key, true)
		if err != nil {
			return err
		}
		if h.lock != nil {
			return &state.LockedError{Key: key.String(), Holder: h.lock}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace); err != nil {
			return fmt.Errorf("failed to clear the history of %s: %w", key, err)
		}
		var current int64
		for _, v := range versions {
			header, err := state.ParseHeader(v.Data)
			if err != nil {
				return fmt.Errorf("version %d: %w", v.Version, err)
			}
			sealed, encoding, err := state.SealFor(v.Data, encKey, state.StateBinding(key, v.Version))
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO terrace_state_versions (namespace, stack, workspace, version, serial, lineage, digest, size, created_at, encoding, data)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
				key.Namespace, key.Stack, key.Workspace, int64(v.Version), header.Serial, header.Lineage, state.Digest(v.Data), int64(len(v.Data)), v.CreatedAt.UTC().Truncate(time.Microsecond), encoding, sealed); err != nil {
				return fmt.Errorf("failed to write version %d of %s: %w", v.Version, key, err)
			}
			current = max(current, int64(v.Version))
		}
		if _, err := tx.Exec(ctx, `UPDATE terrace_state_heads SET current_version=$4::bigint, next_version=$4::bigint+1, migrated=NULL WHERE namespace=$1 AND stack=$2 AND workspace=$3`,
			key.Namespace, key.Stack, key.Workspace, current); err != nil {
			return fmt.Errorf("failed to update the state head of %s: %w", key, err)
		}
		return nil
	})
}
