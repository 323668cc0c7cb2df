package secrets

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/terrace-dev/terrace/internal/state"
)

// Put implements state.Store.
func (s *Store) Put(ctx context.Context, key state.Key, data []byte, opts state.PutOptions) (state.StateMeta, error) {
	if err := key.Validate(); err != nil {
		return state.StateMeta{}, err
	}
	header, err := state.ParseHeader(data)
	if err != nil {
		return state.StateMeta{}, err
	}
	encKey, err := s.keys(ctx, key.Namespace)
	if err != nil {
		return state.StateMeta{}, fmt.Errorf("failed to get the encryption key of namespace %s: %w", key.Namespace, err)
	}
	for range maxAttempts {
		entry, dropped, err := s.putVersion(ctx, key, data, header, encKey, opts)
		if errors.Is(err, errVersionMoved) {
			continue
		}
		if err != nil {
			return state.StateMeta{}, err
		}
		for _, d := range dropped {
			s.deleteChunks(ctx, key.Namespace, d.Blob.Chunks)
		}
		if entry.Version%sweepEvery == 0 {
			s.sweepOrphans(ctx, key)
		}
		return entry.meta(key), nil
	}
	return state.StateMeta{}, fmt.Errorf("failed to write state %s: other writes kept taking its next version during %d attempts", key, maxAttempts)
}

func checkPut(key state.Key, x *indexObject, header state.Header, opts state.PutOptions) error {
	if x.mark != nil {
		return &state.MigratedError{Key: "state " + key.String(), Mark: *x.mark}
	}
	if err := state.CheckLock(key.String(), x.lock, opts.LockID); err != nil {
		return err
	}
	var curVersion state.Version
	var curMeta *state.StateMeta
	if cur := x.current(); cur != nil {
		curVersion = state.Version(cur.Version)
		m := cur.meta(key)
		curMeta = &m
	}
	if err := state.CheckVersion(key.String(), curVersion, opts.IfMatch); err != nil {
		return err
	}
	return state.CheckSuccessor(key.String(), curMeta, header, opts.Force)
}

// errVersionMoved: another write took the version a Put sealed its blob for.
var errVersionMoved = errors.New("the next version was taken")

// putVersion writes data as the index's next version. The blob is sealed
// for that version before the index is swapped, so when another write takes
// the version first it returns errVersionMoved and Put seals again.
func (s *Store) putVersion(ctx context.Context, key state.Key, data []byte, header state.Header, encKey *state.EncryptionKey, opts state.PutOptions) (versionEntry, []versionEntry, error) {
	// Check the preconditions before writing chunks, on this Store's copy
	// of the index and, when that refuses, on a fresh read: a refused
	// write writes nothing. A stale copy that allows the write costs a
	// chunk written again (errVersionMoved) at worst.
	x, err := s.indexForChange(ctx, key)
	if err != nil {
		return versionEntry{}, nil, err
	}
	if err := checkPut(key, x, header, opts); err != nil {
		if !x.cached {
			return versionEntry{}, nil, err
		}
		if x, err = s.loadIndex(ctx, key); err != nil {
			return versionEntry{}, nil, err
		}
		if err := checkPut(key, x, header, opts); err != nil {
			return versionEntry{}, nil, err
		}
	}
	version := x.index.NextVersion
	sealed, encoding, err := state.SealFor(data, encKey, state.StateBinding(key, state.Version(version)))
	if err != nil {
		return versionEntry{}, nil, err
	}
	blob, err := s.stateBlob(ctx, key, sealed, encoding, s.inlineRoom(x), newWriteID())
	if err != nil {
		return versionEntry{}, nil, err
	}
	var (
		entry   versionEntry
		dropped []versionEntry
	)
	err = s.updateIndex(ctx, key, x, func(x *indexObject) error {
		if err := checkPut(key, x, header, opts); err != nil {
			return err
		}
		if x.index.NextVersion != version {
			return errVersionMoved
		}
		entry = versionEntry{Version: version, Serial: header.Serial, Lineage: header.Lineage, Digest: state.Digest(data), Size: int64(len(data)), CreatedAt: time.Now().UTC().Truncate(time.Microsecond), Blob: blob}
		x.index.NextVersion++
		x.index.Versions = append([]versionEntry{entry}, x.index.Versions...)
		dropped = nil
		if len(x.index.Versions) > s.history {
			dropped = append(dropped, x.index.Versions[s.history:]...)
			x.index.Versions = x.index.Versions[:s.history]
		}
		return nil
	})
	if err != nil {
		if refusedBeforeSave(err) {
			s.deleteChunks(context.WithoutCancel(ctx), key.Namespace, blob.Chunks)
		}
		// Otherwise the index write may have been saved with its answer
		// lost (the caller went away, a timeout): deleting the chunks
		// would leave the index pointing at nothing. The orphan sweep
		// removes them if it was not.
		return versionEntry{}, nil, err
	}
	return entry, dropped, nil
}

// refusedBeforeSave reports an updateIndex error that came before any
// index write: a precondition refused or the version taken.
func refusedBeforeSave(err error) bool {
	var conflict *state.ConflictError
	var locked *state.LockedError
	return errors.Is(err, errVersionMoved) || errors.Is(err, state.ErrMigrated) || errors.As(err, &conflict) || errors.As(err, &locked)
}

// stateBlob stores the sealed bytes of one state version: inline when they
// fit in room, otherwise in chunk Secrets named after writeID (to which
// ReplaceHistory, writing several versions at once, adds the version).
func (s *Store) stateBlob(ctx context.Context, key state.Key, sealed []byte, encoding string, room int, writeID string) (blobRef, error) {
	return s.storeBlob(ctx, key.Namespace, sealed, encoding, room, func(i int) string {
		return ObjectName("terrace-state", key.Stack, key.Workspace, fmt.Sprintf("%s-%d", writeID, i))
	}, metav1.ObjectMeta{Labels: stateLabels(key, KindStateChunk), Annotations: stateAnnotations(key)})
}
