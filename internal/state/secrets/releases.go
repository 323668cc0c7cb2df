package secrets

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// ReleaseSecretType is the type of release Secrets. A release record is one
// Secret named terrace.release.v1.<stack>.v<revision> (ReleaseSecretName),
// labelled terrace.dev/stack, terrace.dev/revision and terrace.dev/status,
// whose key "release" holds the gzip JSON body of release.Encode.
const ReleaseSecretType corev1.SecretType = "terrace.dev/release.v1"

// releaseBodyKey is the Secret data key holding the gzip JSON body.
const releaseBodyKey = "release"

var _ release.Store = (*Store)(nil)

// ReleaseSecretName is the name of a release's Secret.
func ReleaseSecretName(stack string, revision int) string {
	return ObjectName("terrace.release.v1", stack, "v"+strconv.Itoa(revision))
}

func releaseToSecret(r *release.Release) (*corev1.Secret, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	body, err := release.Encode(r)
	if err != nil {
		return nil, err
	}
	obj := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: r.Namespace,
			Name:      ReleaseSecretName(r.Stack, r.Revision),
			Labels: map[string]string{
				LabelManagedBy: ManagedByTerrace,
				LabelKind:      KindRelease,
				LabelStack:     LabelValue(r.Stack),
				LabelRevision:  strconv.Itoa(r.Revision),
				LabelStatus:    string(r.Status),
			},
			Annotations: map[string]string{AnnotationStack: r.Stack},
		},
		Type: ReleaseSecretType,
		Data: map[string][]byte{releaseBodyKey: body},
	}
	return obj, nil
}

func releaseFromSecret(obj *corev1.Secret) (*release.Release, error) {
	r, err := release.Decode(obj.Data[releaseBodyKey], "Secret "+obj.Namespace+"/"+obj.Name)
	if err != nil {
		return nil, err
	}
	if r.Migrated, err = ParseMark(obj.Annotations); err != nil {
		return nil, &state.CorruptError{What: "Secret " + obj.Namespace + "/" + obj.Name, Reason: err.Error()}
	}
	return r, nil
}

// CreateRelease implements release.Store.
func (s *Store) CreateRelease(ctx context.Context, r *release.Release) error {
	obj, err := releaseToSecret(r)
	if err != nil {
		return err
	}
	if r.Migrated != nil {
		SetMark(obj, r.Migrated)
	}
	if err := s.client.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return &state.ConflictError{Reason: state.ConflictExists, Key: fmt.Sprintf("release %s/%s revision %d", r.Namespace, r.Stack, r.Revision)}
		}
		return fmt.Errorf("failed to create release Secret %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	return nil
}

// UpdateRelease implements release.Store.
func (s *Store) UpdateRelease(ctx context.Context, r *release.Release) error {
	desired, err := releaseToSecret(r)
	if err != nil {
		return err
	}
	return s.modifyRelease(ctx, r.Namespace, r.Stack, r.Revision, func(obj *corev1.Secret) {
		obj.Labels = desired.Labels
		obj.Data = desired.Data
		obj.Type = desired.Type
	})
}

// modify re-reads and updates a release Secret until its compare-and-swap wins.
func (s *Store) modifyRelease(ctx context.Context, namespace, stack string, revision int, change func(*corev1.Secret)) error {
	for range 20 {
		obj, err := s.getRelease(ctx, namespace, stack, revision)
		if err != nil {
			return err
		}
		change(obj)
		err = s.client.Update(ctx, obj)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("failed to update release Secret %s/%s: %w", obj.Namespace, obj.Name, err)
		}
		return nil
	}
	return fmt.Errorf("failed to update release %d of %s/%s: it kept changing", revision, namespace, stack)
}

func (s *Store) getRelease(ctx context.Context, namespace, stack string, revision int) (*corev1.Secret, error) {
	obj := &corev1.Secret{}
	name := ReleaseSecretName(stack, revision)
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &state.NotFoundError{What: fmt.Sprintf("release %s/%s revision %d", namespace, stack, revision)}
		}
		return nil, fmt.Errorf("failed to read release Secret %s/%s: %w", namespace, name, err)
	}
	if obj.Annotations[AnnotationStack] != stack {
		return nil, fmt.Errorf("secret %s/%s belongs to another release", namespace, name)
	}
	return obj, nil
}

// GetRelease implements release.Store.
func (s *Store) GetRelease(ctx context.Context, namespace, stack string, revision int) (*release.Release, error) {
	obj, err := s.getRelease(ctx, namespace, stack, revision)
	if err != nil {
		return nil, err
	}
	return releaseFromSecret(obj)
}

// ListReleases implements release.Store.
func (s *Store) ListReleases(ctx context.Context, namespace, stack string) ([]release.Release, error) {
	labels := client.MatchingLabels{LabelManagedBy: ManagedByTerrace, LabelKind: KindRelease}
	if stack != "" {
		labels[LabelStack] = LabelValue(stack)
	}
	opts := []client.ListOption{labels}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	list := &corev1.SecretList{}
	if err := s.client.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("failed to list release Secrets: %w", err)
	}
	out := make([]release.Release, 0, len(list.Items))
	for i := range list.Items {
		obj := &list.Items[i]
		if obj.Type != ReleaseSecretType || (stack != "" && obj.Annotations[AnnotationStack] != stack) {
			continue
		}
		r, err := releaseFromSecret(obj)
		if err != nil {
			return nil, err
		}
		out = append(out, *r)
	}
	release.Sort(out)
	return out, nil
}

// DeleteRelease implements release.Store.
func (s *Store) DeleteRelease(ctx context.Context, namespace, stack string, revision int) error {
	obj := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ReleaseSecretName(stack, revision)}}
	if err := s.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete release Secret %s/%s: %w", namespace, obj.Name, err)
	}
	return nil
}

// MarkReleaseMigrated implements release.Store.
func (s *Store) MarkReleaseMigrated(ctx context.Context, namespace, stack string, revision int, mark *state.MigrationMark) error {
	return s.modifyRelease(ctx, namespace, stack, revision, func(obj *corev1.Secret) { SetMark(obj, mark) })
}
