// Package secrets keeps Terrace state, saved plans and release records in
// Secrets of the Stack's namespace.
//
// Each state Key has an index Secret (type terrace.dev/state.v1) listing the
// kept versions; each version's bytes are gzip-compressed, optionally
// AES-256-GCM encrypted, and cut into chunk Secrets (type terrace.dev/chunk.v1)
// of at most 768 KiB, so states far past the 1 MiB Secret limit fit; a small
// version is kept in the index itself (inline.go). A write
// creates the new chunks first and then swaps the index with a
// compare-and-swap on its resourceVersion; chunks of versions that fall out
// of the history are deleted afterwards. Every chunk is checked against the
// sha256 in the index on read. The lock lives in the index Secret too, so a
// write and a lock change can never interleave.
//
// Everything carries the labels app.kubernetes.io/managed-by=terrace,
// terrace.dev/kind, terrace.dev/stack (and terrace.dev/workspace for state),
// so all objects of a Stack can be listed and deleted.
package secrets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/terrace-dev/terrace/internal/state"
)

// DefaultChunkSize keeps each chunk Secret well below the 1 MiB Secret limit.
const DefaultChunkSize = 768 << 10

const (
	indexDataKey = "index"
	lockDataKey  = "lock"
	// maxAttempts bounds the retries of a compare-and-swap that lost to a
	// change that does not touch the caller's preconditions (a lock, a mark).
	maxAttempts = 30
	// orphanGrace is how old an unreferenced chunk must be before a sweep
	// removes it, so chunks of a write still in flight are never touched.
	orphanGrace = 15 * time.Minute
	// sweepEvery: every this many versions a Put also sweeps orphan chunks.
	sweepEvery = 10
)

// Options configure a Store.
type Options struct {
	// History is how many state versions to keep per Key (default state.DefaultHistory).
	History int
	// Keys returns the encryption key of a namespace; nil means no encryption.
	Keys state.KeySource
	// ChunkSize is the largest chunk in bytes (default DefaultChunkSize).
	ChunkSize int
	// InlineBytes is the largest sealed state version (or form of a saved
	// plan) kept in its index instead of in chunks (default
	// DefaultInlineBytes; negative: none).
	InlineBytes int
}

// Store implements state.Store, state.PlanStore and release.Store on Secrets. It reads
// through the client it is given: pass an uncached one (or one whose cache
// covers only Terrace's Secrets) so chunk reads do not fill the cache.
type Store struct {
	client    client.Client
	history   int
	keys      state.KeySource
	chunkSize int
	// inlineBytes: see Options.InlineBytes (0: none).
	inlineBytes int
	indexes     indexCache
	chunks      chunkCache
}

var (
	_ state.Store           = (*Store)(nil)
	_ state.PlanStore       = (*Store)(nil)
	_ state.AdmittingGetter = (*Store)(nil)
)

// New returns a Store writing through c.
func New(c client.Client, opts Options) *Store {
	s := &Store{client: c, history: opts.History, keys: opts.Keys, chunkSize: opts.ChunkSize}
	if s.history <= 0 {
		s.history = state.DefaultHistory
	}
	if s.keys == nil {
		s.keys = state.StaticKey(nil)
	}
	if s.chunkSize <= 0 {
		s.chunkSize = DefaultChunkSize
	}
	switch {
	case opts.InlineBytes == 0:
		s.inlineBytes = DefaultInlineBytes
	case opts.InlineBytes > 0:
		s.inlineBytes = opts.InlineBytes
	}
	return s
}

func (s *Store) log(ctx context.Context) logr.Logger {
	return logf.FromContext(ctx).WithName("state-secrets")
}

// Get implements state.Store.
func (s *Store) Get(ctx context.Context, key state.Key) (*state.State, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return s.readIndexed(ctx, key, func(x *indexObject) *versionEntry { return x.current() }, "state "+key.String())
}

// GetVersion implements state.Store.
func (s *Store) GetVersion(ctx context.Context, key state.Key, version state.Version) (*state.State, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	return s.readIndexed(ctx, key, func(x *indexObject) *versionEntry {
		for i := range x.index.Versions {
			if x.index.Versions[i].Version == int64(version) {
				return &x.index.Versions[i]
			}
		}
		return nil
	}, fmt.Sprintf("state %s version %d", key, version))
}

// GetAdmitted implements state.AdmittingGetter: one read of the index
// gives the size to admit and the chunks to read.
func (s *Store) GetAdmitted(ctx context.Context, key state.Key, admit func(state.StateMeta) error) (*state.State, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	admitted := false
	return s.readIndexed(ctx, key, func(x *indexObject) *versionEntry { return x.current() }, "state "+key.String(), func(e versionEntry) error {
		if admitted {
			return nil
		}
		admitted = true
		return admit(e.meta(key))
	})
}

// readIndexed reads the version pick chooses from the index, calling
// before (when not nil) with it before its chunks are read. A version
// dropped from the history while it was being read has lost its chunks:
// that is not corruption, so the read starts over from a fresh index.
func (s *Store) readIndexed(ctx context.Context, key state.Key, pick func(*indexObject) *versionEntry, what string, before ...func(versionEntry) error) (*state.State, error) {
	for {
		x, err := s.loadIndex(ctx, key)
		if err != nil {
			return nil, err
		}
		e := pick(x)
		if e == nil {
			return nil, &state.NotFoundError{What: what}
		}
		for _, b := range before {
			if err := b(*e); err != nil {
				return nil, err
			}
		}
		st, err := s.readVersion(ctx, key, *e)
		var corrupt *state.CorruptError
		if !errors.As(err, &corrupt) {
			return st, err
		}
		again, reloadErr := s.loadIndex(ctx, key)
		if reloadErr != nil {
			return nil, err
		}
		if still := pick(again); still != nil && still.Version == e.Version && sameBlob(still.Blob, e.Blob) {
			return nil, err
		}
	}
}

// sameBlob says whether a and b name the same stored bytes: the same
// chunks, or (inline, with no chunks) the same sealed digest.
func sameBlob(a, b blobRef) bool {
	if a.SealedDigest != b.SealedDigest || len(a.Chunks) != len(b.Chunks) {
		return false
	}
	for i := range a.Chunks {
		if a.Chunks[i] != b.Chunks[i] {
			return false
		}
	}
	return true
}

func (s *Store) readVersion(ctx context.Context, key state.Key, e versionEntry) (*state.State, error) {
	sealed, err := s.readBlob(ctx, key.Namespace, stateIndexName(key), e.Blob)
	if err != nil {
		return nil, err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	what := fmt.Sprintf("state %s version %d", key, e.Version)
	data, err := state.OpenFor(sealed, e.Blob.Encoding, encKey, state.StateBinding(key, state.Version(e.Version)), what)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != e.Size || state.Digest(data) != e.Digest {
		return nil, &state.CorruptError{What: what, Reason: "decoded state does not match its digest"}
	}
	return &state.State{StateMeta: e.meta(key), Data: data}, nil
}

// ListVersions implements state.Store.
func (s *Store) ListVersions(ctx context.Context, key state.Key) ([]state.StateMeta, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	x, err := s.loadIndex(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make([]state.StateMeta, 0, len(x.index.Versions))
	for _, e := range x.index.Versions {
		out = append(out, e.meta(key))
	}
	return out, nil
}

// sweepOrphans deletes chunk Secrets of key that no index entry references
// and that are older than orphanGrace (left by writes that crashed).
func (s *Store) sweepOrphans(ctx context.Context, key state.Key) {
	x, err := s.loadIndex(ctx, key)
	if err != nil {
		return
	}
	referenced := map[string]bool{}
	for _, e := range x.index.Versions {
		for _, c := range e.Blob.Chunks {
			referenced[c.Name] = true
		}
	}
	chunks, err := s.listObjects(ctx, key.Namespace, stateLabels(key, KindStateChunk))
	if err != nil {
		return
	}
	var orphans []chunkRef
	for _, c := range chunks {
		if c.Annotations[AnnotationStack] != key.Stack || c.Annotations[AnnotationWorkspace] != key.Workspace || referenced[c.Name] {
			continue
		}
		if time.Since(c.CreationTimestamp.Time) > orphanGrace {
			orphans = append(orphans, chunkRef{Name: c.Name})
		}
	}
	s.deleteChunks(ctx, key.Namespace, orphans)
}

// listObjects lists Secrets by labels, with their metadata only.
func (s *Store) listObjects(ctx context.Context, namespace string, labels map[string]string) ([]metav1.PartialObjectMetadata, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	opts := []client.ListOption{client.MatchingLabels(labels)}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := s.client.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("failed to list Secrets: %w", err)
	}
	return list.Items, nil
}

// Delete implements state.Store: the index goes first so no reader ever
// sees an index whose chunks are being removed.
func (s *Store) Delete(ctx context.Context, key state.Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	idx := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: stateIndexName(key)}}
	s.indexes.forget(indexKey(key))
	if err := s.client.Delete(ctx, idx); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete state index Secret %s/%s: %w", key.Namespace, idx.Name, err)
	}
	chunks, err := s.listObjects(ctx, key.Namespace, stateLabels(key, KindStateChunk))
	if err != nil {
		return err
	}
	for _, c := range chunks {
		if c.Annotations[AnnotationStack] != key.Stack || c.Annotations[AnnotationWorkspace] != key.Workspace {
			continue
		}
		obj := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}}
		if err := s.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to delete state chunk Secret %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	return nil
}

// List implements state.Store.
func (s *Store) List(ctx context.Context, namespace string) ([]state.Key, error) {
	items, err := s.listObjects(ctx, namespace, map[string]string{LabelManagedBy: ManagedByTerrace, LabelKind: KindStateIndex})
	if err != nil {
		return nil, err
	}
	keys := make([]state.Key, 0, len(items))
	for _, it := range items {
		keys = append(keys, state.Key{Namespace: it.Namespace, Stack: it.Annotations[AnnotationStack], Workspace: it.Annotations[AnnotationWorkspace]})
	}
	return keys, nil
}
