package config

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state"
)

// secretRef is one Secret reference of a config, with the field that made it.
type secretRef struct {
	field string
	name  string
	key   string
	// check validates the value; its error must not quote the value.
	check         func(value []byte) error
	invalidReason string
}

// secretRefs lists the Secret references the config itself makes (inherited
// ones are checked by the config that makes them).
func secretRefs(cfg *terracev1.TerraceConfig) []secretRef {
	st := cfg.Spec.State
	if st == nil {
		return nil
	}
	var refs []secretRef
	if st.Postgres != nil && st.Postgres.ConnectionSecretRef.Name != "" {
		ref := st.Postgres.ConnectionSecretRef
		refs = append(refs, secretRef{field: "spec.state.postgres.connectionSecretRef", name: ref.Name, key: settings.KeyOrDefault(ref.Key, settings.DefaultPostgresURLKey), check: checkPostgresURL, invalidReason: InvalidPostgresConnectionReason})
	}
	if st.Encryption != nil && st.Encryption.KeySecretRef.Name != "" {
		ref := st.Encryption.KeySecretRef
		refs = append(refs, secretRef{field: "spec.state.encryption.keySecretRef", name: ref.Name, key: settings.KeyOrDefault(ref.Key, settings.DefaultEncryptionKeyKey), check: checkEncryptionKey, invalidReason: InvalidEncryptionKeyReason})
	}
	return refs
}

// checkSecrets verifies that each referenced Secret exists and holds a
// usable value. Messages name Secrets and keys, never values.
func (r *Reconciler) checkSecrets(ctx context.Context, s *configScope) error {
	ns := s.config.Namespace
	for _, ref := range secretRefs(s.config) {
		secret := &corev1.Secret{}
		err := r.SecretReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.name}, secret)
		switch {
		case apierrors.IsNotFound(err):
			return outcome.Terminalf(SecretNotFoundReason, "Secret %s/%s named by %s does not exist: create it with the key %q", ns, ref.name, ref.field, ref.key)
		case err != nil:
			return fmt.Errorf("failed to read Secret %s/%s named by %s: %w", ns, ref.name, ref.field, err)
		}
		value, ok := secret.Data[ref.key]
		if !ok || len(value) == 0 {
			return outcome.Terminalf(SecretKeyMissingReason, "Secret %s/%s named by %s has no key %q: add it", ns, ref.name, ref.field, ref.key)
		}
		if err := ref.check(value); err != nil {
			return outcome.Terminalf(ref.invalidReason, "Secret %s/%s key %q named by %s: %v", ns, ref.name, ref.key, ref.field, err)
		}
		if err := r.checkPostgresHost(ctx, ns, ref, value); err != nil {
			return err
		}
	}
	return nil
}

func checkEncryptionKey(value []byte) error {
	if _, err := state.ParseEncryptionKey(value); err != nil {
		return fmt.Errorf("the encryption key must be 32 bytes, raw or base64-encoded (it is %d bytes)", len(value))
	}
	return nil
}

func checkPostgresURL(value []byte) error {
	// pgx's parse errors may quote the string, password included: say less.
	if _, err := pgxpool.ParseConfig(string(value)); err != nil {
		return errors.New("the value is not a valid PostgreSQL connection URL or key=value string")
	}
	return nil
}
