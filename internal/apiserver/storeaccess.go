package apiserver

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/settings"
)

// A namespace's plan and release stores are opened once and shared by every
// call (internal/backend keeps them 30 s before it reads the Secrets they
// were opened with again, and where they are for 5 s). With Secrets every
// read still goes to the Kubernetes API with the caller's token; a
// PostgreSQL pool, or an encryption key, opened with one caller's rights
// would serve the next caller with none. So a call reads them only once the
// caller, asked with its own token (SelfSubjectAccessReview), may do what
// reading them in Secrets takes and may read every Secret they were opened
// with: as if it had opened them itself, whoever did.

// storeRead is what a call reads from the stores: the verb on Secrets in
// the namespace that reading it from the Secrets backend takes, and what it
// is, for messages.
type storeRead struct {
	verb string
	what string
}

var (
	readReleases = storeRead{verb: "list", what: "release records"}
	readPlans    = storeRead{verb: "get", what: "plans"}
)

// stores opens the namespace's plan and release stores for read, after
// checking that the caller may read them. A misconfigured backend is the
// operator's to fix, and the caller is told so; a caller without the
// rights is PERMISSION_DENIED before anything is read through them.
func (s *site) stores(ctx context.Context, c *call, read storeRead) (*backend.Set, error) {
	if s.Stores == nil {
		return nil, failure(connect.CodeUnavailable, reasonStoreMisconfigured, "this server cannot open the plan and release stores of cluster "+s.Cluster)
	}
	if err := s.mayRead(ctx, c, read); err != nil {
		return nil, err
	}
	set, err := s.Stores.For(ctx, s.Namespace)
	if errors.Is(err, backend.ErrMisconfigured) {
		return nil, failure(connect.CodeUnavailable, reasonStoreMisconfigured, "the state backend of namespace "+s.Namespace+" is misconfigured: "+err.Error())
	}
	if apierrors.IsForbidden(err) {
		// Where the namespace's state is kept is recorded in a Secret, read as the caller.
		return nil, kubeError(err, "the state location of namespace "+s.Namespace)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to open the stores of namespace %s: %w", s.Namespace, err)
	}
	if err := s.mayUse(ctx, c, set, read); err != nil {
		return nil, err
	}
	return set, nil
}

// mayRead checks that the caller may read what read reads in the Secrets
// of the namespace, where it is kept unless the namespace uses PostgreSQL.
func (s *site) mayRead(ctx context.Context, c *call, read storeRead) error {
	ok, err := s.allowedTo(ctx, authorizationv1.ResourceAttributes{Namespace: s.Namespace, Verb: read.verb, Resource: "secrets"})
	if err != nil {
		return err
	}
	if !ok {
		return forbidden(fmt.Sprintf("User %q cannot %s resource \"secrets\" in the namespace %q, which reading the %s of its Stacks takes (kept there, or in the PostgreSQL database its TerraceConfig names, read on the same terms)",
			c.caller.Username, read.verb, s.Namespace, read.what))
	}
	return nil
}

// mayUse checks that the caller may read every Secret set was opened with
// (the location record, the encryption key, the PostgreSQL connection
// string), as opening it would have made it.
func (s *site) mayUse(ctx context.Context, c *call, set *backend.Set, read storeRead) error {
	opened := []settings.SecretKeyRef{{Namespace: s.Namespace, Name: backend.LocationSecretName}}
	if ref := set.Effective.EncryptionKey; ref != nil {
		opened = append(opened, *ref)
	}
	if ref := set.Effective.PostgresConnection; ref != nil && set.Location.Current == terracev1.StateBackendPostgres {
		opened = append(opened, *ref)
	}
	for _, ref := range opened {
		ok, err := s.allowedTo(ctx, authorizationv1.ResourceAttributes{Namespace: ref.Namespace, Verb: "get", Resource: "secrets", Name: ref.Name})
		if err != nil {
			return err
		}
		if !ok {
			return forbidden(fmt.Sprintf("User %q cannot get Secret %q in the namespace %q, with which the %s of namespace %s are opened: ask for get on it, or read them as someone who may",
				c.caller.Username, ref.Name, ref.Namespace, read.what, s.Namespace))
		}
	}
	return nil
}

// permissionDenied returns err when it is a PERMISSION_DENIED answer, else nil.
func permissionDenied(err error) *connect.Error {
	var cerr *connect.Error
	if errors.As(err, &cerr) && cerr.Code() == connect.CodePermissionDenied {
		return cerr
	}
	return nil
}
