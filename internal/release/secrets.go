package release

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// SecretType is the type of release Secrets.
const SecretType corev1.SecretType = "terrace.dev/release.v1"

// bodyKey is the Secret data key holding the gzip JSON body.
const bodyKey = "release"

// SecretStore keeps one Secret per release in the Stack's namespace.
type SecretStore struct {
	client client.Client
}

var _ Store = (*SecretStore)(nil)

// NewSecretStore returns a Store writing Secrets through c (uncached reads are the caller's choice).
func NewSecretStore(c client.Client) *SecretStore { return &SecretStore{client: c} }

// SecretName is the name of a release's Secret.
func SecretName(stack string, revision int) string {
	return secrets.ObjectName("terrace.release.v1", stack, "v"+strconv.Itoa(revision))
}

func (s *SecretStore) toSecret(r *Release) (*corev1.Secret, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	body, err := Encode(r)
	if err != nil {
		return nil, err
	}
	obj := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: r.Namespace,
			Name:      SecretName(r.Stack, r.Revision),
			Labels: map[string]string{
				secrets.LabelManagedBy: secrets.ManagedByTerrace,
				secrets.LabelKind:      secrets.KindRelease,
				secrets.LabelStack:     secrets.LabelValue(r.Stack),
				secrets.LabelRevision:  strconv.Itoa(r.Revision),
				secrets.LabelStatus:    string(r.Status),
			},
			Annotations: map[string]string{secrets.AnnotationStack: r.Stack},
		},
		Type: SecretType,
		Data: map[string][]byte{bodyKey: body},
	}
	return obj, nil
}

func fromSecret(obj *corev1.Secret) (*Release, error) {
	r, err := Decode(obj.Data[bodyKey], "Secret "+obj.Namespace+"/"+obj.Name)
	if err != nil {
		return nil, err
	}
	if r.Migrated, err = secrets.ParseMark(obj.Annotations); err != nil {
		return nil, &state.CorruptError{What: "Secret " + obj.Namespace + "/" + obj.Name, Reason: err.Error()}
	}
	return r, nil
}

// CreateRelease implements Store.
func (s *SecretStore) CreateRelease(ctx context.Context, r *Release) error {
	obj, err := s.toSecret(r)
	if err != nil {
		return err
	}
	if r.Migrated != nil {
		secrets.SetMark(obj, r.Migrated)
	}
	if err := s.client.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return &state.ConflictError{Reason: state.ConflictExists, Key: fmt.Sprintf("release %s/%s revision %d", r.Namespace, r.Stack, r.Revision)}
		}
		return fmt.Errorf("failed to create release Secret %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	return nil
}

// UpdateRelease implements Store.
func (s *SecretStore) UpdateRelease(ctx context.Context, r *Release) error {
	desired, err := s.toSecret(r)
	if err != nil {
		return err
	}
	return s.modify(ctx, r.Namespace, r.Stack, r.Revision, func(obj *corev1.Secret) {
		obj.Labels = desired.Labels
		obj.Data = desired.Data
		obj.Type = desired.Type
	})
}

// modify re-reads and updates a release Secret until its compare-and-swap wins.
func (s *SecretStore) modify(ctx context.Context, namespace, stack string, revision int, change func(*corev1.Secret)) error {
	for range 20 {
		obj, err := s.get(ctx, namespace, stack, revision)
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

func (s *SecretStore) get(ctx context.Context, namespace, stack string, revision int) (*corev1.Secret, error) {
	obj := &corev1.Secret{}
	name := SecretName(stack, revision)
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &state.NotFoundError{What: fmt.Sprintf("release %s/%s revision %d", namespace, stack, revision)}
		}
		return nil, fmt.Errorf("failed to read release Secret %s/%s: %w", namespace, name, err)
	}
	if obj.Annotations[secrets.AnnotationStack] != stack {
		return nil, fmt.Errorf("secret %s/%s belongs to another release", namespace, name)
	}
	return obj, nil
}

// GetRelease implements Store.
func (s *SecretStore) GetRelease(ctx context.Context, namespace, stack string, revision int) (*Release, error) {
	obj, err := s.get(ctx, namespace, stack, revision)
	if err != nil {
		return nil, err
	}
	return fromSecret(obj)
}

// ListReleases implements Store.
func (s *SecretStore) ListReleases(ctx context.Context, namespace, stack string) ([]Release, error) {
	labels := client.MatchingLabels{secrets.LabelManagedBy: secrets.ManagedByTerrace, secrets.LabelKind: secrets.KindRelease}
	if stack != "" {
		labels[secrets.LabelStack] = secrets.LabelValue(stack)
	}
	opts := []client.ListOption{labels}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	list := &corev1.SecretList{}
	if err := s.client.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("failed to list release Secrets: %w", err)
	}
	out := make([]Release, 0, len(list.Items))
	for i := range list.Items {
		obj := &list.Items[i]
		if obj.Type != SecretType || (stack != "" && obj.Annotations[secrets.AnnotationStack] != stack) {
			continue
		}
		r, err := fromSecret(obj)
		if err != nil {
			return nil, err
		}
		out = append(out, *r)
	}
	Sort(out)
	return out, nil
}

// Sort orders releases by namespace, stack and revision.
func Sort(rs []Release) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Stack != b.Stack {
			return a.Stack < b.Stack
		}
		return a.Revision < b.Revision
	})
}

// DeleteRelease implements Store.
func (s *SecretStore) DeleteRelease(ctx context.Context, namespace, stack string, revision int) error {
	obj := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: SecretName(stack, revision)}}
	if err := s.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete release Secret %s/%s: %w", namespace, obj.Name, err)
	}
	return nil
}

// MarkReleaseMigrated implements Store.
func (s *SecretStore) MarkReleaseMigrated(ctx context.Context, namespace, stack string, revision int, mark *state.MigrationMark) error {
	return s.modify(ctx, namespace, stack, revision, func(obj *corev1.Secret) { secrets.SetMark(obj, mark) })
}
