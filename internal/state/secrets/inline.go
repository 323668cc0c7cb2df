package secrets

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/terrace-dev/terrace/internal/state"
)

// Small states are kept in the index Secret itself, not in a chunk Secret
// of their own. A new version then costs one write (the index) instead of
// two (its chunk, then the index), and a version leaving the history
// costs no delete. Most Stacks' states are a few KiB of JSON and far less
// once gzipped. A small saved plan is kept in its plan index the same way.
//
// The index is rewritten by every lock, write and unlock, and each Store
// keeps a copy of every index it touched, so what it may hold inline is
// bounded: DefaultInlineBytes per version, inlineBudgetVersions times that
// for all kept versions together. A version that does not fit goes to
// chunks as before; versions never move between the two forms.
const (
	// DefaultInlineBytes is the largest sealed (gzipped, maybe encrypted)
	// state version, or form of a saved plan, kept in its index.
	DefaultInlineBytes = 2 << 10
	// inlineBudgetVersions: the inline versions of one index hold at most
	// this many times the per-version limit.
	inlineBudgetVersions = 4
)

// inlineRoom is how many sealed bytes a new version of x's state may keep
// inline: what the per-version limit and the index's budget leave, after
// the versions this write drops from the history.
func (s *Store) inlineRoom(x *indexObject) int {
	kept := x.index.Versions
	if len(kept) > s.history-1 {
		kept = kept[:s.history-1]
	}
	used := 0
	for _, e := range kept {
		used += len(e.Blob.Inline)
	}
	return s.inlineLimit(used)
}

// inlineLimit is the room for one more inline version in an index whose
// other inline versions hold used bytes.
func (s *Store) inlineLimit(used int) int {
	if s.inlineBytes <= 0 {
		return 0
	}
	return min(s.inlineBytes, s.inlineBytes*inlineBudgetVersions-used)
}

// storeBlob keeps sealed inline when it fits in room, and otherwise
// writes it to chunk Secrets (writeBlob).
func (s *Store) storeBlob(ctx context.Context, namespace string, sealed []byte, encoding string, room int, names chunkNames, meta metav1.ObjectMeta) (blobRef, error) {
	if len(sealed) <= room {
		return blobRef{Encoding: encoding, SealedDigest: state.Digest(sealed), SealedSize: int64(len(sealed)), Inline: sealed}, nil
	}
	return s.writeBlob(ctx, namespace, sealed, encoding, names, meta)
}

// readInline returns an inline blob's bytes once they match the index's
// digest. owner names the index Secret for the error.
func readInline(namespace, owner string, ref blobRef) ([]byte, error) {
	if int64(len(ref.Inline)) != ref.SealedSize || state.Digest(ref.Inline) != ref.SealedDigest {
		return nil, &state.CorruptError{What: "Secret " + namespace + "/" + owner, Reason: "the data kept in the index does not match its digest"}
	}
	return ref.Inline, nil
}
