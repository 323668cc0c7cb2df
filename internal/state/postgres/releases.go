package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// CreateRelease implements release.Store.
func (s *Store) CreateRelease(ctx context.Context, r *release.Release) error {
	if err := r.Validate(); err != nil {
		return err
	}
	body, err := release.Encode(r)
	if err != nil {
		return err
	}
	mark, err := encodeJSON(r.Migrated)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO terrace_releases (namespace, stack, revision, status, body, migrated) VALUES ($1, $2, $3, $4, $5, $6::jsonb) ON CONFLICT DO NOTHING`,
		r.Namespace, r.Stack, r.Revision, string(r.Status), body, mark)
	if err != nil {
		return fmt.Errorf("failed to write release %d of %s/%s: %w", r.Revision, r.Namespace, r.Stack, err)
	}
	if tag.RowsAffected() == 0 {
		return &state.ConflictError{Reason: state.ConflictExists, Key: fmt.Sprintf("release %s/%s revision %d", r.Namespace, r.Stack, r.Revision)}
	}
	return nil
}

// UpdateRelease implements release.Store.
func (s *Store) UpdateRelease(ctx context.Context, r *release.Release) error {
	if err := r.Validate(); err != nil {
		return err
	}
	body, err := release.Encode(r)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE terrace_releases SET status=$4, body=$5 WHERE namespace=$1 AND stack=$2 AND revision=$3`, r.Namespace, r.Stack, r.Revision, string(r.Status), body)
	if err != nil {
		return fmt.Errorf("failed to update release %d of %s/%s: %w", r.Revision, r.Namespace, r.Stack, err)
	}
	if tag.RowsAffected() == 0 {
		return &state.NotFoundError{What: fmt.Sprintf("release %s/%s revision %d", r.Namespace, r.Stack, r.Revision)}
	}
	return nil
}

func scanRelease(row pgx.Row) (*release.Release, error) {
	var body, mark []byte
	var ns, stack string
	var revision int
	if err := row.Scan(&ns, &stack, &revision, &body, &mark); err != nil {
		return nil, err
	}
	what := fmt.Sprintf("release %s/%s revision %d", ns, stack, revision)
	r, err := release.Decode(body, what)
	if err != nil {
		return nil, err
	}
	if r.Migrated, err = decodeJSON[state.MigrationMark](mark, "migration mark of "+what); err != nil {
		return nil, err
	}
	return r, nil
}

// GetRelease implements release.Store.
func (s *Store) GetRelease(ctx context.Context, namespace, stack string, revision int) (*release.Release, error) {
	r, err := scanRelease(s.pool.QueryRow(ctx, `SELECT namespace, stack, revision, body, migrated FROM terrace_releases WHERE namespace=$1 AND stack=$2 AND revision=$3`, namespace, stack, revision))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &state.NotFoundError{What: fmt.Sprintf("release %s/%s revision %d", namespace, stack, revision)}
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read release %d of %s/%s: %w", revision, namespace, stack, err)
	}
	return r, nil
}

// ListReleases implements release.Store.
func (s *Store) ListReleases(ctx context.Context, namespace, stack string) ([]release.Release, error) {
	rows, err := s.pool.Query(ctx, `SELECT namespace, stack, revision, body, migrated FROM terrace_releases WHERE ($1 = '' OR namespace = $1) AND ($2 = '' OR stack = $2) ORDER BY namespace, stack, revision`, namespace, stack)
	if err != nil {
		return nil, fmt.Errorf("failed to list releases: %w", err)
	}
	defer rows.Close()
	var out []release.Release
	for rows.Next() {
		r, err := scanRelease(rows)
		if err != nil {
			return nil, fmt.Errorf("failed to list releases: %w", err)
		}
		out = append(out, *r)
	}
	return out, rows.Err()
}

// DeleteRelease implements release.Store.
func (s *Store) DeleteRelease(ctx context.Context, namespace, stack string, revision int) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM terrace_releases WHERE namespace=$1 AND stack=$2 AND revision=$3`, namespace, stack, revision); err != nil {
		return fmt.Errorf("failed to delete release %d of %s/%s: %w", revision, namespace, stack, err)
	}
	return nil
}

// MarkReleaseMigrated implements release.Store.
func (s *Store) MarkReleaseMigrated(ctx context.Context, namespace, stack string, revision int, mark *state.MigrationMark) error {
	raw, err := encodeJSON(mark)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE terrace_releases SET migrated=$4::jsonb WHERE namespace=$1 AND stack=$2 AND revision=$3`, namespace, stack, revision, raw)
	if err != nil {
		return fmt.Errorf("failed to mark release %d of %s/%s migrated: %w", revision, namespace, stack, err)
	}
	if tag.RowsAffected() == 0 {
		return &state.NotFoundError{What: fmt.Sprintf("release %s/%s revision %d", namespace, stack, revision)}
	}
	return nil
}
