package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/terrace-dev/terrace/internal/state"
)

const planMetaColumns = `namespace, stack, plan_id, digest, size, readable_digest, readable_format, created_at, migrated, policy`

func scanPlanMeta(row pgx.Row, extra ...any) (state.PlanMeta, error) {
	var m state.PlanMeta
	var format string
	var mark, policy []byte
	dest := append([]any{&m.Key.Namespace, &m.Key.Stack, &m.Key.ID, &m.Digest, &m.Size, &m.ReadableDigest, &format, &m.CreatedAt, &mark, &policy}, extra...)
	if err := row.Scan(dest...); err != nil {
		return m, err
	}
	m.ReadableFormat = state.ReadableFormat(format)
	m.CreatedAt = m.CreatedAt.UTC()
	var err error
	if m.Migrated, err = decodeJSON[state.MigrationMark](mark, "migration mark of plan "+m.Key.String()); err != nil {
		return m, err
	}
	m.Policy, err = decodeJSON[state.PlanPolicy](policy, "policy decision of plan "+m.Key.String())
	return m, err
}

// PutPlan implements state.PlanStore.
func (s *Store) PutPlan(ctx context.Context, plan state.Plan) (state.PlanMeta, error) {
	key := plan.Key
	if err := key.Validate(); err != nil {
		return state.PlanMeta{}, err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return state.PlanMeta{}, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	sealed, encoding, err := state.SealFor(plan.Binary, encKey, state.PlanBinding(key, false))
	if err != nil {
		return state.PlanMeta{}, err
	}
	var readableSealed []byte
	var readableEncoding, readableDigest string
	if plan.Readable != nil {
		if readableSealed, readableEncoding, err = state.SealFor(plan.Readable, encKey, state.PlanBinding(key, true)); err != nil {
			return state.PlanMeta{}, err
		}
		readableDigest = state.Digest(plan.Readable)
	}
	created := plan.CreatedAt.UTC().Truncate(time.Microsecond)
	if created.IsZero() {
		created = time.Now().UTC().Truncate(time.Microsecond)
	}
	digest := state.Digest(plan.Binary)
	policy, err := encodeJSON(plan.Policy)
	if err != nil {
		return state.PlanMeta{}, err
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO terrace_plans (namespace, stack, plan_id, digest, size, readable_digest, readable_format, created_at, encoding, data, readable_encoding, readable_data, policy)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb) ON CONFLICT DO NOTHING`,
		key.Namespace, key.Stack, key.ID, digest, int64(len(plan.Binary)), readableDigest, string(plan.ReadableFormat), created, encoding, sealed, readableEncoding, readableSealed, policy)
	if err != nil {
		return state.PlanMeta{}, fmt.Errorf("failed to write plan %s: %w", key, err)
	}
	meta, err := scanPlanMeta(s.pool.QueryRow(ctx, `SELECT `+planMetaColumns+` FROM terrace_plans WHERE namespace=$1 AND stack=$2 AND plan_id=$3`, key.Namespace, key.Stack, key.ID))
	if err != nil {
		return state.PlanMeta{}, fmt.Errorf("failed to read plan %s back: %w", key, err)
	}
	if tag.RowsAffected() == 0 && (meta.Digest != digest || meta.ReadableDigest != readableDigest) {
		return state.PlanMeta{}, &state.ConflictError{Reason: state.ConflictPlan, Key: key.String(), Stored: meta.Digest, Offered: digest}
	}
	return meta, nil
}

// GetPlan implements state.PlanStore.
func (s *Store) GetPlan(ctx context.Context, key state.PlanKey) (*state.Plan, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	var encoding, readableEncoding string
	var sealed, readableSealed []byte
	meta, err := scanPlanMeta(s.pool.QueryRow(ctx, `SELECT `+planMetaColumns+`, encoding, data, readable_encoding, readable_data FROM terrace_plans WHERE namespace=$1 AND stack=$2 AND plan_id=$3`,
		key.Namespace, key.Stack, key.ID), &encoding, &sealed, &readableEncoding, &readableSealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &state.NotFoundError{What: "plan " + key.String()}
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read plan %s: %w", key, err)
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	plan := &state.Plan{PlanMeta: meta}
	if plan.Binary, err = openVerified(sealed, encoding, encKey, state.PlanBinding(key, false), meta.Digest, "plan file "+key.String()); err != nil {
		return nil, err
	}
	if readableSealed != nil {
		if plan.Readable, err = openVerified(readableSealed, readableEncoding, encKey, state.PlanBinding(key, true), meta.ReadableDigest, "readable plan "+key.String()); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

func openVerified(sealed []byte, encoding string, key *state.EncryptionKey, owner state.Binding, digest, what string) ([]byte, error) {
	data, err := state.OpenFor(sealed, encoding, key, owner, what)
	if err != nil {
		return nil, err
	}
	if state.Digest(data) != digest {
		return nil, &state.CorruptError{What: what, Reason: "decoded data does not match its digest"}
	}
	return data, nil
}

// DeletePlan implements state.PlanStore.
func (s *Store) DeletePlan(ctx context.Context, key state.PlanKey) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM terrace_plans WHERE namespace=$1 AND stack=$2 AND plan_id=$3`, key.Namespace, key.Stack, key.ID); err != nil {
		return fmt.Errorf("failed to delete plan %s: %w", key, err)
	}
	return nil
}

// ListPlans implements state.PlanStore.
func (s *Store) ListPlans(ctx context.Context, namespace, stack string) ([]state.PlanMeta, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+planMetaColumns+` FROM terrace_plans WHERE ($1 = '' OR namespace = $1) AND ($2 = '' OR stack = $2) ORDER BY created_at, namespace, stack, plan_id`, namespace, stack)
	if err != nil {
		return nil, fmt.Errorf("failed to list plans: %w", err)
	}
	defer rows.Close()
	var out []state.PlanMeta
	for rows.Next() {
		m, err := scanPlanMeta(rows)
		if err != nil {
			return nil, fmt.Errorf("failed to list plans: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// MarkPlanMigrated implements state.PlanStore.
func (s *Store) MarkPlanMigrated(ctx context.Context, key state.PlanKey, mark *state.MigrationMark) error {
	raw, err := encodeJSON(mark)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE terrace_plans SET migrated=$4::jsonb WHERE namespace=$1 AND stack=$2 AND plan_id=$3`, key.Namespace, key.Stack, key.ID, raw)
	if err != nil {
		return fmt.Errorf("failed to mark plan %s migrated: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		return &state.NotFoundError{What: "plan " + key.String()}
	}
	return nil
}
