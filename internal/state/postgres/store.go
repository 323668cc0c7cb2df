// Package postgres keeps Terrace state, saved plans and release records in
// PostgreSQL, with the same behaviour as the Secrets backend (both pass
// storetest.RunConformance). The schema is created on start. Writes run in a
// transaction holding the row lock of the state's head row, so
// compare-and-swap, the serial and lineage rules and the lock check see one
// consistent picture. Payloads are gzip-compressed and, with a key,
// AES-256-GCM encrypted exactly as in Secrets.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// Options configure a Store.
type Options struct {
	// History is how many state versions to keep per Key (default state.DefaultHistory).
	History int
	// Keys returns the encryption key of a namespace; nil means no encryption.
	Keys state.KeySource
}

// Store implements state.Store, state.PlanStore and release.Store.
type Store struct {
	pool    *pgxpool.Pool
	ownPool bool
	history int
	keys    state.KeySource
}

var (
	_ state.Store     = (*Store)(nil)
	_ state.PlanStore = (*Store)(nil)
	_ release.Store   = (*Store)(nil)
)

// Open connects to the database at url (a postgres:// URL or key=value
// string), creates the schema when missing and returns a Store. Close it.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		// pgx errors may echo the connection string (with a password): say less.
		return nil, errors.New("failed to parse the PostgreSQL connection string")
	}
	s, err := New(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// New returns a Store on an existing pool, creating the schema when missing.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	s := &Store{pool: pool, history: opts.History, keys: opts.Keys}
	if s.history <= 0 {
		s.history = state.DefaultHistory
	}
	if s.keys == nil {
		s.keys = state.StaticKey(nil)
	}
	if err := s.createSchema(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Close releases the connections when Open made them.
func (s *Store) Close() {
	if s.ownPool {
		s.pool.Close()
	}
}

// head is a state's row in terrace_state_heads.
type head struct {
	exists  bool
	current int64
	next    int64
	lock    *state.LockInfo
	mark    *state.MigrationMark
}

// lockHead makes sure the head row of key exists and locks it for the
// transaction. create=false leaves a missing head missing.
func lockHead(ctx context.Context, tx pgx.Tx, key state.Key, create bool) (*head, error) {
	if create {
		if _, err := tx.Exec(ctx, `INSERT INTO terrace_state_heads (namespace, stack, workspace) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, key.Namespace, key.Stack, key.Workspace); err != nil {
			return nil, fmt.Errorf("failed to create the state head of %s: %w", key, err)
		}
	}
	h := &head{exists: true}
	var lockRaw, markRaw []byte
	err := tx.QueryRow(ctx, `SELECT current_version, next_version, lock_info, migrated FROM terrace_state_heads WHERE namespace=$1 AND stack=$2 AND workspace=$3 FOR UPDATE`,
		key.Namespace, key.Stack, key.Workspace).Scan(&h.current, &h.next, &lockRaw, &markRaw)
	if errors.Is(err, pgx.ErrNoRows) {
		return &head{next: 1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the state head of %s: %w", key, err)
	}
	if h.lock, err = decodeJSON[state.LockInfo](lockRaw, "lock of state "+key.String()); err != nil {
		return nil, err
	}
	if h.mark, err = decodeJSON[state.MigrationMark](markRaw, "migration mark of state "+key.String()); err != nil {
		return nil, err
	}
	return h, nil
}

func decodeJSON[T any](raw []byte, what string) (*T, error) {
	if raw == nil {
		return nil, nil
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, &state.CorruptError{What: what, Reason: "not valid JSON"}
	}
	return v, nil
}

func encodeJSON[T any](v *T) (*string, error) {
	if v == nil {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("failed to encode JSON: %w", err)
	}
	out := string(raw)
	return &out, nil
}

const metaColumns = `version, serial, lineage, digest, size, created_at`

func scanMeta(row pgx.Row, key state.Key, extra ...any) (state.StateMeta, error) {
	m := state.StateMeta{Key: key}
	var version int64
	dest := append([]any{&version, &m.Serial, &m.Lineage, &m.Digest, &m.Size, &m.CreatedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return m, err
	}
	m.Version = state.Version(version)
	m.CreatedAt = m.CreatedAt.UTC()
	return m, nil
}

// Get implements state.Store.
func (s *Store) Get(ctx context.Context, key state.Key) (*state.State, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return s.readVersion(ctx, key, `SELECT v.version, v.serial, v.lineage, v.digest, v.size, v.created_at, v.encoding, v.data
		FROM terrace_state_heads h JOIN terrace_state_versions v USING (namespace, stack, workspace)
		WHERE h.namespace=$1 AND h.stack=$2 AND h.workspace=$3 AND v.version = h.current_version`, "state "+key.String())
}

// GetVersion implements state.Store.
func (s *Store) GetVersion(ctx context.Context, key state.Key, version state.Version) (*state.State, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return s.readVersion(ctx, key, `SELECT `+metaColumns+`, encoding, data FROM terrace_state_versions
		WHERE namespace=$1 AND stack=$2 AND workspace=$3 AND version=$4`, fmt.Sprintf("state %s version %d", key, version), int64(version))
}

func (s *Store) readVersion(ctx context.Context, key state.Key, query, what string, extraArgs ...any) (*state.State, error) {
	var encoding string
	var sealed []byte
	args := append([]any{key.Namespace, key.Stack, key.Workspace}, extraArgs...)
	meta, err := scanMeta(s.pool.QueryRow(ctx, query, args...), key, &encoding, &sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &state.NotFoundError{What: what}
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", what, err)
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	data, err := state.OpenFor(sealed, encoding, encKey, state.StateBinding(key, meta.Version), what)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != meta.Size || state.Digest(data) != meta.Digest {
		return nil, &state.CorruptError{What: what, Reason: "decoded state does not match its digest"}
	}
	return &state.State{StateMeta: meta, Data: data}, nil
}

// ListVersions implements state.Store.
func (s *Store) ListVersions(ctx context.Context, key state.Key) ([]state.StateMeta, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+metaColumns+` FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3 ORDER BY version DESC`, key.Namespace, key.Stack, key.Workspace)
	if err != nil {
		return nil, fmt.Errorf("failed to list versions of %s: %w", key, err)
	}
	defer rows.Close()
	var out []state.StateMeta
	for rows.Next() {
		m, err := scanMeta(rows, key)
		if err != nil {
			return nil, fmt.Errorf("failed to list versions of %s: %w", key, err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// currentMeta reads the current version's metadata inside tx.
func currentMeta(ctx context.Context, tx pgx.Tx, key state.Key, h *head) (*state.StateMeta, error) {
	if h.current == 0 {
		return nil, nil
	}
	m, err := scanMeta(tx.QueryRow(ctx, `SELECT `+metaColumns+` FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3 AND version=$4`,
		key.Namespace, key.Stack, key.Workspace, h.current), key)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &state.CorruptError{What: "state " + key.String(), Reason: fmt.Sprintf("current version %d has no row", h.current)}
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the current version of %s: %w", key, err)
	}
	return &m, nil
}

// Put implements state.Store.
func (s *Store) Put(ctx context.Context, key state.Key, data []byte, opts state.PutOptions) (state.StateMeta, error) {
	if err := key.Validate(); err != nil {
		return state.StateMeta{}, err
	}
	header, err := state.ParseHeader(data)
	if err != nil {
		return state.StateMeta{}, err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return state.StateMeta{}, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	var meta state.StateMeta
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		h, err := lockHead(ctx, tx, key, true)
		if err != nil {
			return err
		}
		if h.mark != nil {
			return &state.MigratedError{Key: "state " + key.String(), Mark: *h.mark}
		}
		if err := state.CheckLock(key.String(), h.lock, opts.LockID); err != nil {
			return err
		}
		if err := state.CheckVersion(key.String(), state.Version(h.current), opts.IfMatch); err != nil {
			return err
		}
		cur, err := currentMeta(ctx, tx, key, h)
		if err != nil {
			return err
		}
		if err := state.CheckSuccessor(key.String(), cur, header, opts.Force); err != nil {
			return err
		}
		// Sealed inside the transaction: the version it is bound to is
		// known only once the head row is locked.
		sealed, encoding, err := state.SealFor(data, encKey, state.StateBinding(key, state.Version(h.next)))
		if err != nil {
			return err
		}
		meta = state.StateMeta{Key: key, Version: state.Version(h.next), Serial: header.Serial, Lineage: header.Lineage, Digest: state.Digest(data), Size: int64(len(data)), CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
		if _, err := tx.Exec(ctx, `INSERT INTO terrace_state_versions (namespace, stack, workspace, version, serial, lineage, digest, size, created_at, encoding, data)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
			key.Namespace, key.Stack, key.Workspace, h.next, meta.Serial, meta.Lineage, meta.Digest, meta.Size, meta.CreatedAt, encoding, sealed); err != nil {
			return fmt.Errorf("failed to write state %s: %w", key, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE terrace_state_heads SET current_version=$4::bigint, next_version=$4::bigint+1 WHERE namespace=$1 AND stack=$2 AND workspace=$3`,
			key.Namespace, key.Stack, key.Workspace, h.next); err != nil {
			return fmt.Errorf("failed to update the state head of %s: %w", key, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3 AND version NOT IN
			(SELECT version FROM terrace_state_versions WHERE namespace=$1 AND stack=$2 AND workspace=$3 ORDER BY version DESC LIMIT $4)`,
			key.Namespace, key.Stack, key.Workspace, s.history); err != nil {
			return fmt.Errorf("failed to trim the history of %s: %w", key, err)
		}
		return nil
	})
	if err != nil {
		return state.StateMeta{}, err
	}
	return meta, nil
}

// Delete implements state.Store.
func (s *Store) Delete(ctx context.Context, key state.Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, table := range []string{"terrace_state_versions", "terrace_state_heads"} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE namespace=$1 AND stack=$2 AND workspace=$3`, key.Namespace, key.Stack, key.Workspace); err != nil {
				return fmt.Errorf("failed to delete state %s: %w", key, err)
			}
		}
		return nil
	})
}

// List implements state.Store.
func (s *Store) List(ctx context.Context, namespace string) ([]state.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT namespace, stack, workspace FROM terrace_state_heads WHERE $1 = '' OR namespace = $1 ORDER BY namespace, stack, workspace`, namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to list states: %w", err)
	}
	defer rows.Close()
	var keys []state.Key
	for rows.Next() {
		var k state.Key
		if err := rows.Scan(&k.Namespace, &k.Stack, &k.Workspace); err != nil {
			return nil, fmt.Errorf("failed to list states: %w", err)
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}
