package secrets

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
)

// DefaultKeyDataKey is the data key of an encryption key Secret when none is named.
const DefaultKeyDataKey = "key"

// KeyFromSecret returns a KeySource reading the AES-256 key (32 bytes, raw
// or base64) from one Secret key for every namespace. It reads at each use,
// so a replaced Secret takes effect without a restart.
func KeyFromSecret(c client.Reader, namespace, name, dataKey string) state.KeySource {
	if dataKey == "" {
		dataKey = DefaultKeyDataKey
	}
	return func(ctx context.Context, _ string) (*state.EncryptionKey, error) {
		var s corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
			return nil, fmt.Errorf("failed to read encryption key Secret %s/%s: %w", namespace, name, err)
		}
		raw, ok := s.Data[dataKey]
		if !ok {
			return nil, fmt.Errorf("encryption key Secret %s/%s has no key %q", namespace, name, dataKey)
		}
		k, err := state.ParseEncryptionKey(raw)
		if err != nil {
			return nil, fmt.Errorf("encryption key Secret %s/%s key %q: %w", namespace, name, dataKey, err)
		}
		return k, nil
	}
}
