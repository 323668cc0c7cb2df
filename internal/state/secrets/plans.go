package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
)

const planDataKey = "plan"

// planIndex is the JSON in a plan index Secret.
type planIndex struct {
	Digest         string               `json:"digest"`
	ReadableDigest string               `json:"readableDigest,omitempty"`
	ReadableFormat state.ReadableFormat `json:"readableFormat,omitempty"`
	Size           int64                `json:"size"`
	ReadableSize   int64                `json:"readableSize,omitempty"`
	CreatedAt      time.Time            `json:"createdAt"`
	Binary         blobRef              `json:"binary"`
	Readable       *blobRef             `json:"readable,omitempty"`
	Policy         *state.PlanPolicy    `json:"policy,omitempty"`
}

func planIndexName(key state.PlanKey) string { return ObjectName("terrace-plan", key.Stack, key.ID) }

func planLabels(key state.PlanKey, kind string) map[string]string {
	return map[string]string{LabelManagedBy: ManagedByTerrace, LabelKind: kind, LabelStack: LabelValue(key.Stack), LabelPlan: LabelValue(key.ID)}
}

func planAnnotations(key state.PlanKey) map[string]string {
	return map[string]string{AnnotationStack: key.Stack, AnnotationPlan: key.ID}
}

func (s *Store) loadPlanIndex(ctx context.Context, key state.PlanKey) (*corev1.Secret, *planIndex, error) {
	obj := &corev1.Secret{}
	name := planIndexName(key)
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, &state.NotFoundError{What: "plan " + key.String()}
		}
		return nil, nil, fmt.Errorf("failed to read plan Secret %s/%s: %w", key.Namespace, name, err)
	}
	if obj.Annotations[AnnotationStack] != key.Stack || obj.Annotations[AnnotationPlan] != key.ID {
		return nil, nil, fmt.Errorf("secret %s/%s belongs to another plan", key.Namespace, name)
	}
	idx := &planIndex{}
	if err := json.Unmarshal(obj.Data[planDataKey], idx); err != nil {
		return nil, nil, &state.CorruptError{What: "Secret " + key.Namespace + "/" + name, Reason: "plan index is not valid JSON"}
	}
	return obj, idx, nil
}

func planMeta(key state.PlanKey, obj *corev1.Secret, idx *planIndex) (state.PlanMeta, error) {
	mark, err := ParseMark(obj.Annotations)
	if err != nil {
		return state.PlanMeta{}, &state.CorruptError{What: "Secret " + obj.Namespace + "/" + obj.Name, Reason: err.Error()}
	}
	return state.PlanMeta{Key: key, Digest: idx.Digest, ReadableDigest: idx.ReadableDigest, ReadableFormat: idx.ReadableFormat, Size: idx.Size, CreatedAt: idx.CreatedAt, Migrated: mark, Policy: idx.Policy}, nil
}

// PutPlan implements state.PlanStore.
func (s *Store) PutPlan(ctx context.Context, plan state.Plan) (state.PlanMeta, error) {
	key := plan.Key
	if err := key.Validate(); err != nil {
		return state.PlanMeta{}, err
	}
	idx := &planIndex{Digest: state.Digest(plan.Binary), Size: int64(len(plan.Binary)), ReadableFormat: plan.ReadableFormat, CreatedAt: plan.CreatedAt.UTC().Truncate(time.Microsecond), Policy: plan.Policy}
	if idx.CreatedAt.IsZero() {
		idx.CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
	}
	if plan.Readable != nil {
		idx.ReadableDigest, idx.ReadableSize = state.Digest(plan.Readable), int64(len(plan.Readable))
	}
	if obj, existing, err := s.loadPlanIndex(ctx, key); err == nil {
		return samePlan(key, obj, existing, idx)
	} else if !errors.Is(err, state.ErrNotFound) {
		return state.PlanMeta{}, err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return state.PlanMeta{}, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	writeID := newWriteID()
	chunkMeta := metav1.ObjectMeta{Labels: planLabels(key, KindPlanChunk), Annotations: planAnnotations(key)}
	sealed, encoding, err := state.SealFor(plan.Binary, encKey, state.PlanBinding(key, false))
	if err != nil {
		return state.PlanMeta{}, err
	}
	// Each of the two forms may be kept inline: a plan's index is written once.
	idx.Binary, err = s.storeBlob(ctx, key.Namespace, sealed, encoding, s.inlineLimit(0), func(i int) string {
		return ObjectName("terrace-plan", key.Stack, key.ID, fmt.Sprintf("%s-b%d", writeID, i))
	}, chunkMeta)
	if err != nil {
		return state.PlanMeta{}, err
	}
	written := idx.Binary.Chunks
	if plan.Readable != nil {
		sealed, encoding, err := state.SealFor(plan.Readable, encKey, state.PlanBinding(key, true))
		if err != nil {
			s.deleteChunks(context.WithoutCancel(ctx), key.Namespace, written)
			return state.PlanMeta{}, err
		}
		readable, err := s.storeBlob(ctx, key.Namespace, sealed, encoding, s.inlineLimit(0), func(i int) string {
			return ObjectName("terrace-plan", key.Stack, key.ID, fmt.Sprintf("%s-r%d", writeID, i))
		}, chunkMeta)
		if err != nil {
			s.deleteChunks(context.WithoutCancel(ctx), key.Namespace, written)
			return state.PlanMeta{}, err
		}
		idx.Readable = &readable
		written = append(written, readable.Chunks...)
	}
	raw, err := json.Marshal(idx)
	if err != nil {
		return state.PlanMeta{}, fmt.Errorf("failed to encode plan index: %w", err)
	}
	obj := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: planIndexName(key), Labels: planLabels(key, KindPlanIndex), Annotations: planAnnotations(key)},
		Type:       TypePlanIndex,
		Data:       map[string][]byte{planDataKey: raw},
	}
	if err := s.client.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			obj, existing, loadErr := s.loadPlanIndex(ctx, key)
			if loadErr == nil && !sameBlob(existing.Binary, idx.Binary) {
				// Another write's index: these chunks are no one's.
				s.deleteChunks(context.WithoutCancel(ctx), key.Namespace, written)
			}
			if loadErr == nil {
				return samePlan(key, obj, existing, idx)
			}
		}
		// Any other failure may be a create that was saved with its answer
		// lost (the caller went away, a timeout): deleting the chunks would
		// leave that index naming nothing. DeletePlan removes them with the
		// plan, by label.
		return state.PlanMeta{}, fmt.Errorf("failed to create plan Secret %s/%s: %w", key.Namespace, obj.Name, err)
	}
	return planMeta(key, obj, idx)
}

// samePlan accepts a repeated PutPlan of identical bytes and refuses other bytes.
func samePlan(key state.PlanKey, obj *corev1.Secret, existing, offered *planIndex) (state.PlanMeta, error) {
	if existing.Digest != offered.Digest || existing.ReadableDigest != offered.ReadableDigest {
		return state.PlanMeta{}, &state.ConflictError{Reason: state.ConflictPlan, Key: key.String(), Stored: existing.Digest, Offered: offered.Digest}
	}
	return planMeta(key, obj, existing)
}

// GetPlan implements state.PlanStore.
func (s *Store) GetPlan(ctx context.Context, key state.PlanKey) (*state.Plan, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	obj, idx, err := s.loadPlanIndex(ctx, key)
	if err != nil {
		return nil, err
	}
	meta, err := planMeta(key, obj, idx)
	if err != nil {
		return nil, err
	}
	plan := &state.Plan{PlanMeta: meta}
	if plan.Binary, err = s.readPlanBlob(ctx, key, idx.Binary, idx.Digest, false); err != nil {
		return nil, err
	}
	if idx.Readable != nil {
		if plan.Readable, err = s.readPlanBlob(ctx, key, *idx.Readable, idx.ReadableDigest, true); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

func (s *Store) readPlanBlob(ctx context.Context, key state.PlanKey, ref blobRef, digest string, readable bool) ([]byte, error) {
	what := "plan file"
	if readable {
		what = "readable plan"
	}
	sealed, err := s.readBlob(ctx, key.Namespace, planIndexName(key), ref)
	if err != nil {
		return nil, err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	label := what + " " + key.String()
	data, err := state.OpenFor(sealed, ref.Encoding, encKey, state.PlanBinding(key, readable), label)
	if err != nil {
		return nil, err
	}
	if state.Digest(data) != digest {
		return nil, &state.CorruptError{What: label, Reason: "decoded data does not match its digest"}
	}
	return data, nil
}

// DeletePlan implements state.PlanStore.
func (s *Store) DeletePlan(ctx context.Context, key state.PlanKey) error {
	if err := key.Validate(); err != nil {
		return err
	}
	idx := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: planIndexName(key)}}
	if err := s.client.Delete(ctx, idx); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete plan Secret %s/%s: %w", key.Namespace, idx.Name, err)
	}
	chunks, err := s.listObjects(ctx, key.Namespace, planLabels(key, KindPlanChunk))
	if err != nil {
		return err
	}
	for _, c := range chunks {
		if c.Annotations[AnnotationStack] != key.Stack || c.Annotations[AnnotationPlan] != key.ID {
			continue
		}
		obj := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}}
		if err := s.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to delete plan chunk Secret %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	return nil
}

// ListPlans implements state.PlanStore.
func (s *Store) ListPlans(ctx context.Context, namespace, stack string) ([]state.PlanMeta, error) {
	labels := map[string]string{LabelManagedBy: ManagedByTerrace, LabelKind: KindPlanIndex}
	if stack != "" {
		labels[LabelStack] = LabelValue(stack)
	}
	list := &corev1.SecretList{}
	opts := []client.ListOption{client.MatchingLabels(labels)}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := s.client.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("failed to list plan Secrets: %w", err)
	}
	out := make([]state.PlanMeta, 0, len(list.Items))
	for i := range list.Items {
		obj := &list.Items[i]
		key := state.PlanKey{Namespace: obj.Namespace, Stack: obj.Annotations[AnnotationStack], ID: obj.Annotations[AnnotationPlan]}
		if stack != "" && key.Stack != stack {
			continue
		}
		idx := &planIndex{}
		if err := json.Unmarshal(obj.Data[planDataKey], idx); err != nil {
			return nil, &state.CorruptError{What: "Secret " + obj.Namespace + "/" + obj.Name, Reason: "plan index is not valid JSON"}
		}
		meta, err := planMeta(key, obj, idx)
		if err != nil {
			return nil, err
		}
		out = append(out, meta)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// MarkPlanMigrated implements state.PlanStore.
func (s *Store) MarkPlanMigrated(ctx context.Context, key state.PlanKey, mark *state.MigrationMark) error {
	if err := key.Validate(); err != nil {
		return err
	}
	for range maxAttempts {
		obj, _, err := s.loadPlanIndex(ctx, key)
		if err != nil {
			return err
		}
		SetMark(obj, mark)
		err = s.client.Update(ctx, obj)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("failed to mark plan Secret %s/%s: %w", key.Namespace, obj.Name, err)
		}
		return nil
	}
	return fmt.Errorf("failed to mark plan %s: it kept changing", key)
}
