package stack

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Condition reasons about spec.backend.
const (
	// BackendCredentialsNotFoundReason: a credentials Secret or key is missing.
	BackendCredentialsNotFoundReason = "BackendCredentialsNotFound"
	// BackendCredentialsForbiddenReason: the runner's ServiceAccount may not get a credentials Secret.
	BackendCredentialsForbiddenReason = "BackendCredentialsForbidden"
)

// ownsBackend says whether the Stack keeps its state in a backend of its
// own (spec.backend) rather than on Terrace's state server: Terrace then
// neither reads nor unlocks nor deletes that state.
func ownsBackend(stack *terracev1.Stack) bool { return stack.Spec.Backend != nil }

// resolveBackend reads the credentials of spec.backend (Secrets the
// runner's ServiceAccount may get, as for varsFrom) into the run's init
// request, and folds the block into the inputs digest: a changed backend
// is a new plan. Secret values are not hashed, their resourceVersions are.
func (r *Reconciler) resolveBackend(ctx context.Context, s *scope) error {
	b := s.stack.Spec.Backend
	if b == nil {
		return nil
	}
	config := map[string]json.RawMessage{}
	for k, v := range b.Config {
		config[k] = json.RawMessage(v.Raw)
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return outcome.Terminalf(InvalidVarsReason, "spec.backend.config is not valid JSON: %v", err)
	}
	own := &runnerv1.OwnBackend{Type: b.Type, ConfigJson: configJSON}
	s.backendVersions = nil
	for i, c := range b.Credentials {
		value, version, err := r.readBackendCredential(ctx, s, i, c)
		if err != nil {
			return err
		}
		own.Credentials = append(own.Credentials, &runnerv1.BackendCredential{Env: c.Env, Value: value, AsFile: c.AsFile})
		s.backendVersions = append(s.backendVersions, fmt.Sprintf("credential %q=%s@%s[%s] file=%t\n", c.Env, c.SecretKeyRef.Name, version, c.SecretKeyRef.Key, c.AsFile))
	}
	s.backend = own
	s.inputs.digest = desiredDigest(s)
	return nil
}

// readBackendCredential returns one credential's value and its Secret's
// resourceVersion, read uncached, only when the runner's ServiceAccount
// may get the Secret itself.
func (r *Reconciler) readBackendCredential(ctx context.Context, s *scope, i int, c terracev1.BackendCredential) (string, string, error) {
	ns, sa, name := s.stack.Namespace, runnerServiceAccount(s), c.SecretKeyRef.Name
	allowed, err := r.serviceAccountMayGet(ctx, sa, "Secret", types.NamespacedName{Namespace: ns, Name: name})
	if err != nil {
		return "", "", err
	}
	if !allowed {
		return "", "", outcome.Terminalf(BackendCredentialsForbiddenReason,
			"spec.backend.credentials[%d]: ServiceAccount %s, which the Stack's runner runs as, may not get Secret %s/%s, so Terrace does not read it: grant it get on that Secret",
			i, sa, ns, name)
	}
	sec := &corev1.Secret{}
	err = r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return "", "", outcome.Terminalf(BackendCredentialsNotFoundReason, "spec.backend.credentials[%d]: Secret %s/%s not found: create it", i, ns, name)
	}
	if err != nil {
		return "", "", fmt.Errorf("failed to read spec.backend.credentials[%d] Secret %s: %w", i, name, err)
	}
	value, ok := sec.Data[c.SecretKeyRef.Key]
	if !ok {
		return "", "", outcome.Terminalf(BackendCredentialsNotFoundReason, "spec.backend.credentials[%d]: Secret %s/%s has no key %q: add it", i, ns, name, c.SecretKeyRef.Key)
	}
	return string(value), sec.ResourceVersion, nil
}
