package secrets

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
)

// Secret types of the objects this package writes.
const (
	TypeStateIndex corev1.SecretType = "terrace.dev/state.v1"
	TypePlanIndex  corev1.SecretType = "terrace.dev/plan.v1"
	TypeChunk      corev1.SecretType = "terrace.dev/chunk.v1"

	// chunkDataKey holds a chunk's bytes.
	chunkDataKey = "chunk"
	// parallelChunkIO bounds concurrent chunk reads and writes of one blob.
	parallelChunkIO = 4
)

// chunkRef names one chunk Secret and what it must contain.
type chunkRef struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	Size   int    `json:"size"`
}

// blobRef is one stored payload: sealed bytes (gzip, maybe encrypted) cut
// into chunks, or kept inline in the index when small (inline.go), with a
// digest of the whole sealed payload.
type blobRef struct {
	Encoding     string     `json:"encoding"`
	SealedDigest string     `json:"sealedDigest"`
	SealedSize   int64      `json:"sealedSize"`
	Chunks       []chunkRef `json:"chunks"`
	// Inline holds the sealed bytes when there are no chunks.
	Inline []byte `json:"inline,omitempty"`
}

// chunkNames is how a blob's chunk Secrets are named: the index's name
// parts plus a write id and the chunk number.
type chunkNames func(i int) string

// newWriteID returns a random id that keeps the chunks of concurrent or
// crashed writes apart.
func newWriteID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeBlob creates the chunk Secrets of sealed. On failure it removes what it wrote.
func (s *Store) writeBlob(ctx context.Context, namespace string, sealed []byte, encoding string, names chunkNames, meta metav1.ObjectMeta) (blobRef, error) {
	ref := blobRef{Encoding: encoding, SealedDigest: state.Digest(sealed), SealedSize: int64(len(sealed))}
	for i, off := 0, 0; off < len(sealed) || i == 0; i++ {
		end := min(off+s.chunkSize, len(sealed))
		part := sealed[off:end]
		ref.Chunks = append(ref.Chunks, chunkRef{Name: names(i), Digest: state.Digest(part), Size: len(part)})
		off = end
	}
	errs := make([]error, len(ref.Chunks))
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallelChunkIO)
	off := 0
	for i, c := range ref.Chunks {
		part := sealed[off : off+c.Size]
		off += c.Size
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			obj := &corev1.Secret{ObjectMeta: *meta.DeepCopy(), Type: TypeChunk, Immutable: new(true), Data: map[string][]byte{chunkDataKey: part}}
			obj.Name, obj.Namespace = c.Name, namespace
			if err := s.client.Create(ctx, obj); err != nil {
				errs[i] = fmt.Errorf("failed to create chunk Secret %s/%s: %w", namespace, c.Name, err)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			s.deleteChunks(context.WithoutCancel(ctx), namespace, ref.Chunks)
			return blobRef{}, err
		}
	}
	off = 0
	for _, c := range ref.Chunks {
		s.chunks.put(namespace, c.Name, sealed[off:off+c.Size])
		off += c.Size
	}
	return ref, nil
}

// readBlob reads and verifies every chunk of ref (or its inline bytes) and
// returns the sealed bytes. A missing chunk or any digest mismatch is a
// *state.CorruptError; owner names the index that holds ref.
func (s *Store) readBlob(ctx context.Context, namespace, owner string, ref blobRef) ([]byte, error) {
	if len(ref.Chunks) == 0 {
		return readInline(namespace, owner, ref)
	}
	parts := make([][]byte, len(ref.Chunks))
	errs := make([]error, len(ref.Chunks))
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallelChunkIO)
	for i, c := range ref.Chunks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			parts[i], errs[i] = s.readChunk(ctx, namespace, c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	sealed := bytes.Join(parts, nil)
	if int64(len(sealed)) != ref.SealedSize || state.Digest(sealed) != ref.SealedDigest {
		return nil, &state.CorruptError{What: "Secret chunks of " + namespace + "/" + ref.Chunks[0].Name, Reason: "assembled data does not match the index digest"}
	}
	return sealed, nil
}

func (s *Store) readChunk(ctx context.Context, namespace string, c chunkRef) ([]byte, error) {
	if data, ok := s.chunks.get(namespace, c); ok {
		return data, nil
	}
	var obj corev1.Secret
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: c.Name}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &state.CorruptError{What: "Secret " + namespace + "/" + c.Name, Reason: "chunk is missing"}
		}
		return nil, fmt.Errorf("failed to read chunk Secret %s/%s: %w", namespace, c.Name, err)
	}
	data, ok := obj.Data[chunkDataKey]
	if !ok || len(data) != c.Size || state.Digest(data) != c.Digest {
		return nil, &state.CorruptError{What: "Secret " + namespace + "/" + c.Name, Reason: "chunk does not match its digest"}
	}
	s.chunks.put(namespace, c.Name, data)
	return data, nil
}

// deleteChunks removes chunk Secrets, ignoring those already gone. It is
// garbage collection: failures leave orphans that a later sweep removes.
func (s *Store) deleteChunks(ctx context.Context, namespace string, chunks []chunkRef) {
	for _, c := range chunks {
		s.chunks.forget(namespace, c.Name)
		obj := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: c.Name}}
		if err := s.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			s.log(ctx).V(1).Info("failed to delete chunk secret, a later sweep retries", "secret", namespace+"/"+c.Name, "error", err.Error())
		}
	}
}
