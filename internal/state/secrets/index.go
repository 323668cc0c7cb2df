package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
)

// stateIndex is the JSON in an index Secret.
type stateIndex struct {
	// NextVersion is the Version the next Put gets.
	NextVersion int64 `json:"nextVersion"`
	// Versions are the kept versions, newest (current) first.
	Versions []versionEntry `json:"versions"`
}

type versionEntry struct {
	Version   int64     `json:"version"`
	Serial    int64     `json:"serial"`
	Lineage   string    `json:"lineage"`
	Digest    string    `json:"digest"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"createdAt"`
	Blob      blobRef   `json:"blob"`
}

func (e versionEntry) meta(key state.Key) state.StateMeta {
	return state.StateMeta{Key: key, Version: state.Version(e.Version), Serial: e.Serial, Lineage: e.Lineage, Digest: e.Digest, Size: e.Size, CreatedAt: e.CreatedAt}
}

// indexObject is a loaded index Secret (or a new one, when obj.ResourceVersion is "").
type indexObject struct {
	obj   *corev1.Secret
	index stateIndex
	lock  *state.LockInfo
	mark  *state.MigrationMark
	// cached says obj is this Store's last copy, not a fresh read.
	cached bool
}

func (x *indexObject) current() *versionEntry {
	if len(x.index.Versions) == 0 {
		return nil
	}
	return &x.index.Versions[0]
}

func stateIndexName(key state.Key) string {
	return ObjectName("terrace-state", key.Stack, key.Workspace)
}

func stateLabels(key state.Key, kind string) map[string]string {
	return map[string]string{
		LabelManagedBy: ManagedByTerrace,
		LabelKind:      kind,
		LabelStack:     LabelValue(key.Stack),
		LabelWorkspace: LabelValue(key.Workspace),
	}
}

func stateAnnotations(key state.Key) map[string]string {
	return map[string]string{AnnotationStack: key.Stack, AnnotationWorkspace: key.Workspace}
}

func indexKey(key state.Key) client.ObjectKey {
	return client.ObjectKey{Namespace: key.Namespace, Name: stateIndexName(key)}
}

// newIndexObject is the index of a key that has none yet.
func newIndexObject(key state.Key) *indexObject {
	return &indexObject{obj: &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: stateIndexName(key), Labels: stateLabels(key, KindStateIndex), Annotations: stateAnnotations(key)},
		Type:       TypeStateIndex,
	}, index: stateIndex{NextVersion: 1}}
}

// loadIndex reads the index Secret of key from the API server; a missing
// one yields an empty, not yet created index object.
func (s *Store) loadIndex(ctx context.Context, key state.Key) (*indexObject, error) {
	obj := &corev1.Secret{}
	err := s.client.Get(ctx, indexKey(key), obj)
	if apierrors.IsNotFound(err) {
		s.indexes.put(indexKey(key), nil)
		return newIndexObject(key), nil
	}
	if err != nil {
		s.indexes.forget(indexKey(key))
		return nil, fmt.Errorf("failed to read state index Secret %s/%s: %w", key.Namespace, indexKey(key).Name, err)
	}
	s.indexes.put(indexKey(key), obj)
	return parseIndex(key, obj)
}

// indexForChange returns this Store's last copy of key's index, or reads
// it when there is none: the start of a change, whose compare-and-swap
// refuses a stale copy.
func (s *Store) indexForChange(ctx context.Context, key state.Key) (*indexObject, error) {
	obj, ok := s.indexes.get(indexKey(key))
	if !ok {
		return s.loadIndex(ctx, key)
	}
	x := newIndexObject(key)
	if obj != nil {
		var err error
		if x, err = parseIndex(key, obj); err != nil {
			return s.loadIndex(ctx, key)
		}
	}
	x.cached = true
	return x, nil
}

// parseIndex reads an index Secret of key.
func parseIndex(key state.Key, obj *corev1.Secret) (*indexObject, error) {
	name := obj.Name
	if obj.Annotations[AnnotationStack] != key.Stack || obj.Annotations[AnnotationWorkspace] != key.Workspace {
		return nil, fmt.Errorf("secret %s/%s belongs to another state (stack %q, workspace %q)", key.Namespace, name, obj.Annotations[AnnotationStack], obj.Annotations[AnnotationWorkspace])
	}
	x := &indexObject{obj: obj, index: stateIndex{NextVersion: 1}}
	if raw, ok := obj.Data[indexDataKey]; ok {
		if err := json.Unmarshal(raw, &x.index); err != nil {
			return nil, &state.CorruptError{What: "Secret " + key.Namespace + "/" + name, Reason: "index is not valid JSON"}
		}
	}
	if raw, ok := obj.Data[lockDataKey]; ok {
		x.lock = &state.LockInfo{}
		if err := json.Unmarshal(raw, x.lock); err != nil {
			return nil, &state.CorruptError{What: "Secret " + key.Namespace + "/" + name, Reason: "lock is not valid JSON"}
		}
	}
	mark, err := ParseMark(obj.Annotations)
	if err != nil {
		return nil, &state.CorruptError{What: "Secret " + key.Namespace + "/" + name, Reason: err.Error()}
	}
	x.mark = mark
	return x, nil
}

// ParseMark reads the migration mark annotation, nil when absent.
func ParseMark(annotations map[string]string) (*state.MigrationMark, error) {
	raw, ok := annotations[AnnotationMigrated]
	if !ok {
		return nil, nil
	}
	var m state.MigrationMark
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, errors.New("migration mark is not valid JSON")
	}
	return &m, nil
}

// SetMark sets (or with nil removes) the migration mark annotation.
func SetMark(obj *corev1.Secret, mark *state.MigrationMark) {
	if mark == nil {
		delete(obj.Annotations, AnnotationMigrated)
		return
	}
	raw, _ := json.Marshal(mark)
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[AnnotationMigrated] = string(raw)
}

// saveIndex writes x back with a compare-and-swap on its resourceVersion. It
// reports lostRace when another writer changed the Secret first.
func (s *Store) saveIndex(ctx context.Context, x *indexObject) (lostRace bool, err error) {
	raw, err := json.Marshal(x.index)
	if err != nil {
		return false, fmt.Errorf("failed to encode state index: %w", err)
	}
	if x.obj.Data == nil {
		x.obj.Data = map[string][]byte{}
	}
	x.obj.Data[indexDataKey] = raw
	delete(x.obj.Data, lockDataKey)
	if x.lock != nil {
		lockRaw, err := json.Marshal(x.lock)
		if err != nil {
			return false, fmt.Errorf("failed to encode lock info: %w", err)
		}
		x.obj.Data[lockDataKey] = lockRaw
	}
	SetMark(x.obj, x.mark)
	if x.obj.ResourceVersion == "" {
		err = s.client.Create(ctx, x.obj)
	} else {
		err = s.client.Update(ctx, x.obj)
	}
	key := client.ObjectKeyFromObject(x.obj)
	if err != nil {
		// Whatever happened, the copy may be stale now (or the write
		// saved with its answer lost): the next change reads afresh.
		s.indexes.forget(key)
	}
	// NotFound: the index was deleted since it was read; try again on what is there now.
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || (apierrors.IsNotFound(err) && x.obj.ResourceVersion != "") {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("failed to write state index Secret %s/%s: %w", x.obj.Namespace, x.obj.Name, err)
	}
	s.indexes.put(key, x.obj)
	return false, nil
}

// errUnchanged, returned by an updateIndex change, ends it successfully without a write.
var errUnchanged = errors.New("unchanged")

// updateIndex runs change on the index and saves it, again and again
// while another writer wins the race. change returns an error to stop. The
// first attempt starts from first when not nil, else from this Store's
// copy of the index (indexForChange); a refusal or errUnchanged on a copy
// is decided again on a fresh read.
func (s *Store) updateIndex(ctx context.Context, key state.Key, first *indexObject, change func(x *indexObject) error) error {
	for attempt := range maxAttempts {
		x := first
		first = nil
		if x == nil {
			var err error
			if attempt == 0 {
				x, err = s.indexForChange(ctx, key)
			} else {
				x, err = s.loadIndex(ctx, key)
			}
			if err != nil {
				return err
			}
		}
		if err := change(x); err != nil {
			if x.cached {
				continue
			}
			if errors.Is(err, errUnchanged) {
				return nil
			}
			return err
		}
		lost, err := s.saveIndex(ctx, x)
		if err != nil || !lost {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("failed to update state index of %s: %w", key, err)
		}
	}
	return fmt.Errorf("failed to update state index of %s: it kept changing during %d attempts", key, maxAttempts)
}

// LastKnownSize implements state.SizeHinter from this Store's last copy of
// key's index: 0 when it was found not to exist.
func (s *Store) LastKnownSize(key state.Key) (int64, bool) {
	obj, ok := s.indexes.get(indexKey(key))
	if !ok {
		return 0, false
	}
	if obj == nil {
		return 0, true
	}
	x, err := parseIndex(key, obj)
	if err != nil {
		return 0, false
	}
	if e := x.current(); e != nil {
		return e.Size, true
	}
	return 0, true
}

// StateAfterApply implements state.LockHolderReader: the state as this
// Store's release of owner's apply lock left it, while that release is
// still the last this Store knows of key. A run takes one apply lock, and
// writes the state only under it; its release was a compare-and-swap on
// the index, so that copy holds the run's last write. A release on another
// replica leaves no such copy here, and the caller reads the index.
func (s *Store) StateAfterApply(ctx context.Context, key state.Key, owner string) (*state.State, bool) {
	x := s.lockCopyOf(key, owner, true)
	if x == nil || x.current() == nil {
		return nil, false
	}
	st, err := s.readVersion(ctx, key, *x.current())
	if err != nil {
		return nil, false
	}
	return st, true
}

// GetUnderOwnLock implements state.LockHolderReader: a read by the holder
// of the apply lock this Store took for it, while that lock is still the
// last this Store knows of key, is served from the copy the lock left. The
// lock was a compare-and-swap on the index, so the copy was current then,
// and no one but the holder may write the state while it is held: the read
// is the read the holder would have made just after taking its lock.
//
// Only an apply lock answers: a run (owner names one run) takes one, and
// it is the only one under which the run writes. An earlier lock of the
// same run (a plan's, released on another replica) would leave a copy
// that another replica's apply may have moved past. The chunks are read
// (or taken from the chunk cache) as in any read. ok is false when the
// copy does not answer; the caller reads as usual then.
func (s *Store) GetUnderOwnLock(ctx context.Context, key state.Key, owner string, admit func(state.StateMeta) error) (st *state.State, ok bool, err error) {
	x := s.lockCopyOf(key, owner, false)
	if x == nil || x.lock == nil || x.lock.Owner != owner || x.lock.Operation != state.ApplyOperation {
		return nil, false, nil
	}
	e := x.current()
	if e == nil {
		return nil, true, &state.NotFoundError{What: "state " + key.String()}
	}
	if err := admit(e.meta(key)); err != nil {
		return nil, true, err
	}
	st, err = s.readVersion(ctx, key, *e)
	var corrupt *state.CorruptError
	if errors.As(err, &corrupt) {
		return nil, false, nil // decided on a fresh read
	}
	return st, true, err
}

// lockCopyOf parses the cached index if taking (released false) or
// releasing owner's lock here is still the last this Store knows of key.
func (s *Store) lockCopyOf(key state.Key, owner string, released bool) *indexObject {
	obj := s.indexes.lockCopyOf(indexKey(key), owner, released)
	if obj == nil {
		return nil
	}
	x, err := parseIndex(key, obj)
	if err != nil {
		return nil
	}
	return x
}
