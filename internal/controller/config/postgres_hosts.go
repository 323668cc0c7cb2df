package config

import (
	"context"
	"errors"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
)

// PostgresHostNotAllowedReason: a namespace's TerraceConfig names a
// PostgreSQL server the operator does not allow.
const PostgresHostNotAllowedReason = "PostgresHostNotAllowed"

// checkPostgresHost refuses a postgres connection Secret of a namespace
// config that names a server the operator does not allow.
func (r *Reconciler) checkPostgresHost(ctx context.Context, namespace string, ref secretRef, value []byte) error {
	if ref.invalidReason != InvalidPostgresConnectionReason || r.PostgresHosts == nil {
		return nil
	}
	err := r.PostgresHosts.Check(ctx, namespace, string(value))
	if errors.Is(err, settings.ErrPostgresHostNotAllowed) {
		return outcome.Terminalf(PostgresHostNotAllowedReason, "Secret %s/%s key %q named by %s: %v", namespace, ref.name, ref.key, ref.field, err)
	}
	return err
}
