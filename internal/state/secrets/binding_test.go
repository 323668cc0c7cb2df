package secrets_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

func indexSecret(t *testing.T, key state.Key) *corev1.Secret {
	t.Helper()
	obj := &corev1.Secret{}
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: key.Namespace, Name: secrets.ObjectName("terrace-state", key.Stack, key.Workspace)}, obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

func setIndex(t *testing.T, key state.Key, index []byte) {
	t.Helper()
	obj := indexSecret(t, key)
	obj.Data["index"] = index
	if err := env.Client.Update(ctx(t), obj); err != nil {
		t.Fatal(err)
	}
}

// The attack on Secrets: someone who may write Secrets but not read the
// key makes Stack B's state index point at Stack A's encrypted chunks, or
// copies in A's small state kept inline (digests and sizes match, so every
// plain check passes). B's state no longer opens, with an error saying the
// data was not sealed for it; A is untouched; putting B's own index back
// recovers B.
func TestStateChunksOfAnotherStackFailToOpen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload int
	}{{"chunked", 2 << 20}, {"inline", 100}} {
		t.Run(tc.name, func(t *testing.T) { stateOfAnotherStackFailsToOpen(t, tc.payload) })
	}
}

func stateOfAnotherStackFailsToOpen(t *testing.T, payload int) {
	ns := env.Namespace(t)
	s := secrets.New(env.Client, secrets.Options{Keys: state.StaticKey(newKey(t))})
	a := state.Key{Namespace: ns, Stack: "a", Workspace: "default"}
	b := state.Key{Namespace: ns, Stack: "b", Workspace: "default"}
	for i, k := range []state.Key{a, b} {
		if _, err := s.Put(ctx(t), k, storetest.StateJSON("lineage-"+k.Stack, 1, i, payload), state.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if inline := len(chunkSecrets(t, ns)) == 0; inline != (payload < secrets.DefaultInlineBytes) {
		t.Fatalf("a state of %d bytes kept inline: %v", payload, inline)
	}
	origA, _ := s.Get(ctx(t), a)
	origB, _ := s.Get(ctx(t), b)
	indexB := bytes.Clone(indexSecret(t, b).Data["index"])

	setIndex(t, b, indexSecret(t, a).Data["index"])
	_, err := s.Get(ctx(t), b)
	var corrupt *state.CorruptError
	if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), "not sealed for state "+ns+"/b/default version 1") {
		t.Fatalf("B's state made of A's: %v", err)
	}
	if got, err := s.Get(ctx(t), a); err != nil || !bytes.Equal(got.Data, origA.Data) {
		t.Fatalf("A's state changed: %v", err)
	}
	setIndex(t, b, indexB)
	if got, err := s.Get(ctx(t), b); err != nil || !bytes.Equal(got.Data, origB.Data) {
		t.Fatalf("B does not recover with its own index: %v", err)
	}
}

// A state sealed before binding existed (the first format, no associated
// data) still reads; the next write is bound and the old version stays
// readable in the history.
func TestUnboundStateStillReadsAndIsRewrittenBound(t *testing.T) {
	ns := env.Namespace(t)
	raw, key := storetest.RawKey(t)
	s := secrets.New(env.Client, secrets.Options{Keys: state.StaticKey(key)})
	k := state.Key{Namespace: ns, Stack: "old", Workspace: "default"}
	old := storetest.StateJSON("lineage-o", 1, 1, 1000)
	if _, err := s.Put(ctx(t), k, old, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// Replace version 1's blob with the same state sealed the old way.
	sealed, encoding := storetest.SealUnbound(t, old, raw)
	chunk := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secrets.ObjectName("terrace-state", "old", "default", "legacy-0"),
		Labels:      map[string]string{secrets.LabelManagedBy: secrets.ManagedByTerrace, secrets.LabelKind: secrets.KindStateChunk, secrets.LabelStack: "old", secrets.LabelWorkspace: "default"},
		Annotations: map[string]string{secrets.AnnotationStack: "old", secrets.AnnotationWorkspace: "default"}},
		Type: secrets.TypeChunk, Data: map[string][]byte{"chunk": sealed}}
	if err := env.Client.Create(ctx(t), chunk); err != nil {
		t.Fatal(err)
	}
	var index map[string]any
	_ = json.Unmarshal(indexSecret(t, k).Data["index"], &index)
	v1 := index["versions"].([]any)[0].(map[string]any)
	v1["blob"] = map[string]any{"encoding": encoding, "sealedDigest": state.Digest(sealed), "sealedSize": len(sealed),
		"chunks": []any{map[string]any{"name": chunk.Name, "digest": state.Digest(sealed), "size": len(sealed)}}}
	rawIndex, _ := json.Marshal(index)
	setIndex(t, k, rawIndex)

	got, err := s.Get(ctx(t), k)
	if err != nil || !bytes.Equal(got.Data, old) {
		t.Fatalf("unbound state does not read: %v", err)
	}
	if _, err := s.Put(ctx(t), k, storetest.StateJSON("lineage-o", 2, 1, 1000), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(indexSecret(t, k).Data["index"], &index)
	current := index["versions"].([]any)[0].(map[string]any)
	if enc := current["blob"].(map[string]any)["encoding"].(string); !state.IsBound(enc) {
		t.Fatalf("the next write kept the unbound format %q", enc)
	}
	if v, err := s.GetVersion(ctx(t), k, 1); err != nil || !bytes.Equal(v.Data, old) {
		t.Fatalf("the unbound version in the history no longer reads: %v", err)
	}
}
