package secrets_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// storedIndex is the part of an index Secret's JSON these tests look at.
type storedIndex struct {
	Versions []struct {
		Version int64 `json:"version"`
		Blob    struct {
			SealedSize int64             `json:"sealedSize"`
			Chunks     []json.RawMessage `json:"chunks"`
			Inline     []byte            `json:"inline"`
		} `json:"blob"`
	} `json:"versions"`
}

func readStoredIndex(t *testing.T, key state.Key) storedIndex {
	t.Helper()
	var x storedIndex
	if err := json.Unmarshal(indexSecret(t, key).Data["index"], &x); err != nil {
		t.Fatal(err)
	}
	return x
}

// A small state costs one write per version, the index's, and leaves no
// chunk Secret behind; versions leaving the history cost no delete.
func TestSmallStatesLiveInTheIndexWithoutChunkSecrets(t *testing.T) {
	ns := env.Namespace(t)
	c := &countingClient{Client: env.Client}
	s := secrets.New(c, secrets.Options{History: 3, Keys: state.StaticKey(newKey(t))})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	written := map[state.Version][]byte{}
	for serial := int64(1); serial <= 5; serial++ {
		data := storetest.StateJSON("lin", serial, int(serial), 200)
		var meta state.StateMeta
		calls := c.during(t, "put", func() (err error) {
			meta, err = s.Put(ctx(t), key, data, state.PutOptions{})
			return err
		})
		want := int64(1) // the index's write
		if serial == 1 {
			want = 2 // and its read first: this Store has no copy of it yet
		}
		if calls != want {
			t.Errorf("put of serial %d made %d API calls, want %d", serial, calls, want)
		}
		written[meta.Version] = data
	}
	if n := len(chunkSecrets(t, ns)); n != 0 {
		t.Fatalf("%d chunk Secrets for small states, want none", n)
	}
	x := readStoredIndex(t, key)
	if len(x.Versions) != 3 {
		t.Fatalf("the index keeps %d versions, want the history's 3", len(x.Versions))
	}
	reader := secrets.New(env.Client, secrets.Options{History: 3, Keys: state.StaticKey(nil)})
	for _, v := range x.Versions {
		if len(v.Blob.Chunks) != 0 || int64(len(v.Blob.Inline)) != v.Blob.SealedSize {
			t.Errorf("version %d: %d chunks, %d inline bytes of %d", v.Version, len(v.Blob.Chunks), len(v.Blob.Inline), v.Blob.SealedSize)
		}
		got, err := s.GetVersion(ctx(t), key, state.Version(v.Version))
		if err != nil || !bytes.Equal(got.Data, written[state.Version(v.Version)]) {
			t.Errorf("version %d does not read back: %v", v.Version, err)
		}
		// Kept inline, the state is still sealed with the namespace's key.
		if _, err := reader.GetVersion(ctx(t), key, state.Version(v.Version)); err == nil {
			t.Errorf("version %d opened without the encryption key", v.Version)
		}
	}
}

// What an index keeps inline is bounded per version and in all: a state
// larger than the limit, and versions past the index's budget, go to
// chunks, and every version reads back whichever way it is kept.
func TestTheIndexKeepsABoundedAmountOfStateInline(t *testing.T) {
	ns := env.Namespace(t)
	const limit = 1024
	s := secrets.New(env.Client, secrets.Options{History: 10, InlineBytes: limit})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	written := map[int64][]byte{}
	put := func(serial int64, payload int) {
		t.Helper()
		data := storetest.StateJSON("lin", serial, 0, payload)
		meta, err := s.Put(ctx(t), key, data, state.PutOptions{})
		if err != nil {
			t.Fatal(err)
		}
		written[int64(meta.Version)] = data
	}
	put(1, 4<<10) // larger than the limit once sealed
	for serial := int64(2); serial <= 10; serial++ {
		put(serial, 800) // each fits the limit; together they pass the budget
	}
	x := readStoredIndex(t, key)
	inline, chunked := 0, 0
	for _, v := range x.Versions {
		switch {
		case len(v.Blob.Inline) > limit:
			t.Errorf("version %d keeps %d bytes inline, over the limit of %d", v.Version, len(v.Blob.Inline), limit)
		case len(v.Blob.Inline) > 0:
			inline += len(v.Blob.Inline)
		default:
			chunked++
		}
		got, err := s.GetVersion(ctx(t), key, state.Version(v.Version))
		if err != nil || !bytes.Equal(got.Data, written[v.Version]) {
			t.Errorf("version %d does not read back: %v", v.Version, err)
		}
	}
	if x.Versions[len(x.Versions)-1].Blob.Inline != nil {
		t.Errorf("the first version, larger than the limit, is kept inline")
	}
	if inline > 4*limit {
		t.Errorf("the index keeps %d bytes inline, over its budget of %d", inline, 4*limit)
	}
	if chunked < 2 || inline == 0 {
		t.Errorf("%d versions in chunks, %d bytes inline: want both forms", chunked, inline)
	}
	if n := len(chunkSecrets(t, ns)); n != chunked {
		t.Errorf("%d chunk Secrets for %d chunked versions", n, chunked)
	}
}

// Damaged inline data is a corrupt state, never a state read wrong.
func TestDamagedInlineStateIsCorrupt(t *testing.T) {
	ns := env.Namespace(t)
	s := secrets.New(env.Client, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	if _, err := s.Put(ctx(t), key, storetest.StateJSON("lin", 1, 0, 100), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	obj := indexSecret(t, key)
	var raw map[string]any
	if err := json.Unmarshal(obj.Data["index"], &raw); err != nil {
		t.Fatal(err)
	}
	blob := raw["versions"].([]any)[0].(map[string]any)["blob"].(map[string]any)
	var inline []byte
	if err := json.Unmarshal([]byte(`"`+blob["inline"].(string)+`"`), &inline); err != nil {
		t.Fatal(err)
	}
	inline[len(inline)/2] ^= 0xff
	blob["inline"] = inline
	damaged, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	setIndex(t, key, damaged)
	_, err = secrets.New(env.Client, secrets.Options{}).Get(ctx(t), key)
	var corrupt *state.CorruptError
	if !errors.As(err, &corrupt) {
		t.Fatalf("reading a damaged inline state: %v, want a corrupt-data error", err)
	}
	t.Logf("the error: %v", err)
}

// Indexes written before states were kept inline (every version in
// chunks) read as before, and a store that keeps nothing inline reads
// the versions another store kept inline: one history holds both forms.
func TestChunkedAndInlineVersionsShareAHistory(t *testing.T) {
	ns := env.Namespace(t)
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	chunking := secrets.New(env.Client, secrets.Options{InlineBytes: -1})
	inlining := secrets.New(env.Client, secrets.Options{})
	first := storetest.StateJSON("lin", 1, 0, 100)
	second := storetest.StateJSON("lin", 2, 0, 100)
	if _, err := chunking.Put(ctx(t), key, first, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := len(chunkSecrets(t, ns)); n != 1 {
		t.Fatalf("with inline states off, a state made %d chunk Secrets, want 1", n)
	}
	if _, err := inlining.Put(ctx(t), key, second, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*secrets.Store{chunking, inlining} {
		for v, want := range map[state.Version][]byte{1: first, 2: second} {
			got, err := s.GetVersion(ctx(t), key, v)
			if err != nil || !bytes.Equal(got.Data, want) {
				t.Errorf("version %d does not read back: %v", v, err)
			}
		}
	}
}

// A small saved plan, both its forms, is kept in its plan index: one
// Secret a plan. A larger one goes to chunks; both read back.
func TestSmallPlansLiveInTheirIndex(t *testing.T) {
	ns := env.Namespace(t)
	s := secrets.New(env.Client, secrets.Options{Keys: state.StaticKey(newKey(t))})
	for _, tc := range []struct {
		id          string
		size        int
		wantChunked bool
	}{{"small", 300, false}, {"large", 16 << 10, true}} {
		plan := state.Plan{
			PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: "app", ID: tc.id}, ReadableFormat: state.ReadableJSON},
			Binary:   randomBytes(t, tc.size),
			Readable: randomBytes(t, tc.size),
		}
		if _, err := s.PutPlan(ctx(t), plan); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetPlan(ctx(t), plan.Key)
		if err != nil || !bytes.Equal(got.Binary, plan.Binary) || !bytes.Equal(got.Readable, plan.Readable) {
			t.Fatalf("plan %s does not read back: %v", tc.id, err)
		}
		var list corev1.SecretList
		if err := env.Client.List(ctx(t), &list, client.InNamespace(ns), client.MatchingLabels{secrets.LabelKind: secrets.KindPlanChunk, secrets.LabelPlan: tc.id}); err != nil {
			t.Fatal(err)
		}
		if chunked := len(list.Items) > 0; chunked != tc.wantChunked {
			t.Errorf("plan %s of %d bytes: %d chunk Secrets", tc.id, tc.size, len(list.Items))
		}
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
