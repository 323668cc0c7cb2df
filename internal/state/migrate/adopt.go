package migrate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
)

// The Terraform kubernetes backend (used by tofu-controller) keeps state in a
// Secret tfstate-<workspace>-<suffix> whose key "tfstate" holds the gzip'd
// state JSON, and its lock in a Lease lock-<secret name>.
const (
	tfstateDataKey        = "tfstate"
	tfstateLockAnnotation = "app.terraform.io/lock-info"
	// AnnotationAdoptedBy is set on an adopted Secret: which state took it over, and when.
	AnnotationAdoptedBy = "terrace.dev/adopted-by"
	// maxAdoptedState bounds decompression of a foreign Secret.
	maxAdoptedState = 1 << 30
)

// TofuControllerSecretName is the state Secret tofu-controller writes for a
// Terraform object name and workspace.
func TofuControllerSecretName(workspace, name string) string {
	return "tfstate-" + workspace + "-" + name
}

// AdoptResult says what Adopt did.
type AdoptResult struct {
	Meta state.StateMeta
	// AlreadyAdopted is true when the store held this state (or a later
	// serial of its lineage) before: nothing was written.
	AlreadyAdopted bool
}

// Adopt imports the state in the kubernetes-backend Secret namespace/name
// into store under key, verifies it, and annotates the Secret (which is
// kept). A Secret locked by a running tofu, a store holding another state
// for key, and a Secret without state are errors. Re-running is safe.
func Adopt(ctx context.Context, c client.Client, namespace, name string, store state.Store, key state.Key) (AdoptResult, error) {
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret); err != nil {
		return AdoptResult{}, fmt.Errorf("failed to read state Secret %s/%s: %w", namespace, name, err)
	}
	raw, ok := secret.Data[tfstateDataKey]
	if !ok || len(raw) == 0 {
		return AdoptResult{}, fmt.Errorf("secret %s/%s has no %q key: it is not a Terraform kubernetes-backend state", namespace, name, tfstateDataKey)
	}
	data, err := decompressState(raw)
	if err != nil {
		return AdoptResult{}, fmt.Errorf("secret %s/%s: %w", namespace, name, err)
	}
	header, err := state.ParseHeader(data)
	if err != nil {
		return AdoptResult{}, fmt.Errorf("secret %s/%s: %w", namespace, name, err)
	}
	if err := checkLease(ctx, c, namespace, "lock-"+name); err != nil {
		return AdoptResult{}, err
	}

	current, err := store.Get(ctx, key)
	switch {
	case errors.Is(err, state.ErrNotFound):
		if _, err := store.Put(ctx, key, data, state.PutOptions{IfMatch: state.Absent}); err != nil {
			return AdoptResult{}, fmt.Errorf("failed to store the adopted state as %s: %w", key, err)
		}
	case err != nil:
		return AdoptResult{}, err
	case current.Digest == state.Digest(data):
		return AdoptResult{Meta: current.StateMeta, AlreadyAdopted: true}, annotateAdopted(ctx, c, secret, key)
	case current.Lineage == header.Lineage && current.Serial >= header.Serial:
		// Adopted earlier and applied since: the store is ahead.
		return AdoptResult{Meta: current.StateMeta, AlreadyAdopted: true}, annotateAdopted(ctx, c, secret, key)
	default:
		return AdoptResult{}, fmt.Errorf("state %s already holds another state (lineage %q serial %d, the Secret has lineage %q serial %d): refusing to overwrite it", key, current.Lineage, current.Serial, header.Lineage, header.Serial)
	}
	got, err := store.Get(ctx, key)
	if err != nil {
		return AdoptResult{}, fmt.Errorf("failed to read the adopted state back: %w", err)
	}
	if !bytes.Equal(got.Data, data) {
		return AdoptResult{}, fmt.Errorf("adopted state %s failed verification", key)
	}
	return AdoptResult{Meta: got.StateMeta}, annotateAdopted(ctx, c, secret, key)
}

func decompressState(raw []byte) ([]byte, error) {
	if len(raw) < 2 || raw[0] != 0x1f || raw[1] != 0x8b {
		return raw, nil // plain JSON, as some tools write it
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("state is not valid gzip: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, maxAdoptedState+1))
	if err != nil {
		return nil, fmt.Errorf("state is not valid gzip: %w", err)
	}
	if len(data) > maxAdoptedState {
		return nil, errors.New("state is larger than 1 GiB uncompressed")
	}
	return data, nil
}

// checkLease refuses a state whose kubernetes-backend Lease is held.
func checkLease(ctx context.Context, c client.Client, namespace, name string) error {
	lease := &coordinationv1.Lease{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, lease)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to read lock Lease %s/%s: %w", namespace, name, err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return nil
	}
	holder := &state.LockInfo{ID: *lease.Spec.HolderIdentity}
	if raw, ok := lease.Annotations[tfstateLockAnnotation]; ok {
		_ = json.Unmarshal([]byte(raw), holder)
	}
	return &state.LockedError{Key: "Secret " + namespace + "/" + name, Holder: holder}
}

func annotateAdopted(ctx context.Context, c client.Client, secret *corev1.Secret, key state.Key) error {
	value := key.String() + " " + time.Now().UTC().Format(time.RFC3339)
	if old, ok := secret.Annotations[AnnotationAdoptedBy]; ok && len(old) > len(key.String()) && old[:len(key.String())+1] == key.String()+" " {
		return nil
	}
	patch := client.MergeFrom(secret.DeepCopy())
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations[AnnotationAdoptedBy] = value
	if err := c.Patch(ctx, secret, patch); err != nil {
		return fmt.Errorf("failed to annotate adopted Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	return nil
}
