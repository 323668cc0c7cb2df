package postgres

// The tables of the state, plan and release stores, created when a store opens.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// schemaLockID serialises schema creation between processes starting together.
const schemaLockID = 0x7465727261636501

var schema = []string{
	`CREATE TABLE IF NOT EXISTS terrace_state_heads (
		namespace text NOT NULL,
		stack text NOT NULL,
		workspace text NOT NULL,
		current_version bigint NOT NULL DEFAULT 0,
		next_version bigint NOT NULL DEFAULT 1,
		lock_info jsonb,
		migrated jsonb,
		PRIMARY KEY (namespace, stack, workspace))`,
	`CREATE TABLE IF NOT EXISTS terrace_state_versions (
		namespace text NOT NULL,
		stack text NOT NULL,
		workspace text NOT NULL,
		version bigint NOT NULL,
		serial bigint NOT NULL,
		lineage text NOT NULL,
		digest text NOT NULL,
		size bigint NOT NULL,
		created_at timestamptz NOT NULL,
		encoding text NOT NULL,
		data bytea NOT NULL,
		PRIMARY KEY (namespace, stack, workspace, version))`,
	// Payloads are compressed already: store them without another try at it.
	`ALTER TABLE terrace_state_versions ALTER COLUMN data SET STORAGE EXTERNAL`,
	`CREATE TABLE IF NOT EXISTS terrace_plans (
		namespace text NOT NULL,
		stack text NOT NULL,
		plan_id text NOT NULL,
		digest text NOT NULL,
		size bigint NOT NULL,
		readable_digest text NOT NULL DEFAULT '',
		readable_format text NOT NULL DEFAULT '',
		created_at timestamptz NOT NULL,
		encoding text NOT NULL,
		data bytea NOT NULL,
		readable_encoding text NOT NULL DEFAULT '',
		readable_data bytea,
		migrated jsonb,
		PRIMARY KEY (namespace, stack, plan_id))`,
	`ALTER TABLE terrace_plans ALTER COLUMN data SET STORAGE EXTERNAL`,
	// Added after the table: databases made before keep working.
	`ALTER TABLE terrace_plans ADD COLUMN IF NOT EXISTS policy jsonb`,
	`CREATE TABLE IF NOT EXISTS terrace_releases (
		namespace text NOT NULL,
		stack text NOT NULL,
		revision integer NOT NULL,
		status text NOT NULL,
		body bytea NOT NULL,
		migrated jsonb,
		PRIMARY KEY (namespace, stack, revision))`,
}

func (s *Store) createSchema(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLockID)); err != nil {
			return fmt.Errorf("failed to lock the schema: %w", err)
		}
		for _, stmt := range schema {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("failed to create the schema: %w", err)
			}
		}
		return nil
	})
}
