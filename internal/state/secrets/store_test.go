package secrets_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

func newKey(t *testing.T) *state.EncryptionKey {
	t.Helper()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	k, err := state.ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestConformance(t *testing.T) {
	key := newKey(t)
	storetest.RunConformance(t, func(t *testing.T) storetest.Backend {
		s := secrets.New(env.Client, secrets.Options{History: 3, Keys: state.StaticKey(key)})
		return storetest.Backend{States: s, Plans: s, Releases: s, Namespace: env.Namespace(t), History: 3}
	})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func chunkSecrets(t *testing.T, ns string) []corev1.Secret {
	t.Helper()
	var list corev1.SecretList
	if err := env.Client.List(ctx(t), &list, client.InNamespace(ns), client.MatchingLabels{secrets.LabelKind: secrets.KindStateChunk}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// A 10 MiB state is spread over chunk Secrets each under the size limit,
// with the labels that find everything of a Stack.
func TestLargeStateIsChunkedBelowTheSecretLimit(t *testing.T) {
	ns := env.Namespace(t)
	s := secrets.New(env.Client, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "big", Workspace: "default"}
	data := storetest.StateJSON("l", 1, 0, 10<<20)
	if _, err := s.Put(ctx(t), key, data, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	chunks := chunkSecrets(t, ns)
	if len(chunks) < 8 {
		t.Fatalf("a 10 MiB state of random text made %d chunks, want at least 8", len(chunks))
	}
	for _, c := range chunks {
		if n := len(c.Data["chunk"]); n > secrets.DefaultChunkSize {
			t.Fatalf("chunk %s holds %d bytes", c.Name, n)
		}
		if c.Labels[secrets.LabelStack] != "big" || c.Labels[secrets.LabelManagedBy] != "terrace" || c.Type != secrets.TypeChunk {
			t.Fatalf("chunk %s has labels %v type %s", c.Name, c.Labels, c.Type)
		}
	}
	got, err := s.Get(ctx(t), key)
	if err != nil || !bytes.Equal(got.Data, data) {
		t.Fatalf("round trip: %v", err)
	}
	// A Delete removes every chunk.
	if err := s.Delete(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	if left := chunkSecrets(t, ns); len(left) != 0 {
		t.Fatalf("%d chunks left after Delete", len(left))
	}
}

func TestMissingOrCorruptChunkIsAnError(t *testing.T) {
	for _, damage := range []string{"delete", "corrupt", "truncate"} {
		t.Run(damage, func(t *testing.T) {
			ns := env.Namespace(t)
			s := secrets.New(env.Client, secrets.Options{Keys: state.StaticKey(newKey(t))})
			key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
			if _, err := s.Put(ctx(t), key, storetest.StateJSON("l", 1, 0, 3<<20), state.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			chunks := chunkSecrets(t, ns)
			victim := chunks[len(chunks)/2]
			if err := env.Client.Delete(ctx(t), &victim); err != nil {
				t.Fatal(err)
			}
			if damage != "delete" {
				data := bytes.Clone(victim.Data["chunk"])
				if damage == "corrupt" {
					data[len(data)/2] ^= 0xff
				} else {
					data = data[:len(data)-1]
				}
				replacement := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: victim.Name, Labels: victim.Labels, Annotations: victim.Annotations}, Type: victim.Type, Data: map[string][]byte{"chunk": data}}
				if err := env.Client.Create(ctx(t), replacement); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Get(ctx(t), key)
			var corrupt *state.CorruptError
			if !errors.As(err, &corrupt) {
				t.Fatalf("Get with a %sd chunk returned %v (state %v), want a CorruptError", damage, err, got != nil)
			}
			if !strings.Contains(err.Error(), victim.Name) {
				t.Fatalf("error %q does not name the damaged chunk %s", err, victim.Name)
			}
		})
	}
}

func TestEncryptionKeyMustMatch(t *testing.T) {
	ns := env.Namespace(t)
	key := state.Key{Namespace: ns, Stack: "enc", Workspace: "default"}
	data := storetest.StateJSON("l", 1, 0, 1000)
	encrypted := secrets.New(env.Client, secrets.Options{Keys: state.StaticKey(newKey(t))})
	if _, err := encrypted.Put(ctx(t), key, data, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// The stored bytes are not the gzip of the state: nothing readable is at rest.
	for _, c := range chunkSecrets(t, ns) {
		if bytes.Contains(c.Data["chunk"], []byte("lineage")) || bytes.HasPrefix(c.Data["chunk"], []byte{0x1f, 0x8b}) {
			t.Fatal("chunk holds plain or merely compressed data")
		}
	}
	for name, other := range map[string]*secrets.Store{
		"no key":    secrets.New(env.Client, secrets.Options{}),
		"other key": secrets.New(env.Client, secrets.Options{Keys: state.StaticKey(newKey(t))}),
	} {
		_, err := other.Get(ctx(t), key)
		if err == nil || !strings.Contains(err.Error(), "key") {
			t.Fatalf("%s: Get returned %v, want an error about the key", name, err)
		}
	}
}

// lostAnswerClient saves the next Update and then answers as if the caller
// had gone away: the write is done, its answer lost.
type lostAnswerClient struct {
	client.Client
	lose bool
	// loseCreate, when set, loses the answer of the next Create of a
	// Secret of that type in the same way.
	loseCreate corev1.SecretType
}

func (c *lostAnswerClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, obj, opts...)
	if secret, ok := obj.(*corev1.Secret); ok && err == nil && c.loseCreate != "" && secret.Type == c.loseCreate {
		c.loseCreate = ""
		return context.Canceled
	}
	return err
}

func (c *lostAnswerClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	err := c.Client.Update(ctx, obj, opts...)
	if err == nil && c.lose {
		c.lose = false
		return context.Canceled
	}
	return err
}

// Found by the chaos harness (runner killed mid-state-upload): the state
// server's write was cancelled with the upload after the index was saved,
// and the store deleted the chunks the saved index named, so every later
// read was "chunk is missing". A write whose answer is lost keeps its chunks.
func TestAPutWhoseAnswerIsLostLeavesAReadableState(t *testing.T) {
	ns := env.Namespace(t)
	lossy := &lostAnswerClient{Client: env.Client}
	s := secrets.New(lossy, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	first := []byte(`{"version":4,"serial":1,"lineage":"l","resources":[]}`)
	if _, err := s.Put(ctx(t), key, first, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	second := []byte(`{"version":4,"serial":2,"lineage":"l","resources":[],"pad":"` + strings.Repeat("x", 100) + `"}`)
	lossy.lose = true
	if _, err := s.Put(ctx(t), key, second, state.PutOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with its answer lost: %v, want the cancellation", err)
	}
	got, err := s.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("Get after a Put whose answer was lost: %v", err)
	}
	if got.Serial != 2 || !bytes.Equal(got.Data, second) {
		t.Fatalf("Get = serial %d, want the saved serial 2", got.Serial)
	}
}

// The plan store in the same case: a PutPlan whose index create was saved
// with its answer lost keeps the chunks that index names, so the plan can
// still be read (and approved).
func TestAPutPlanWhoseAnswerIsLostLeavesAReadablePlan(t *testing.T) {
	ns := env.Namespace(t)
	lossy := &lostAnswerClient{Client: env.Client, loseCreate: secrets.TypePlanIndex}
	s := secrets.New(lossy, secrets.Options{})
	key := state.PlanKey{Namespace: ns, Stack: "app", ID: "p1"}
	plan := state.Plan{PlanMeta: state.PlanMeta{Key: key}, Binary: []byte("plan file bytes"), Readable: []byte(`{"readable":true}`)}
	if _, err := s.PutPlan(ctx(t), plan); !errors.Is(err, context.Canceled) {
		t.Fatalf("PutPlan with its answer lost: %v, want the cancellation", err)
	}
	got, err := s.GetPlan(ctx(t), key)
	if err != nil {
		t.Fatalf("GetPlan after a PutPlan whose answer was lost: %v", err)
	}
	if !bytes.Equal(got.Binary, plan.Binary) || !bytes.Equal(got.Readable, plan.Readable) {
		t.Fatalf("GetPlan = %q / %q, want the saved plan", got.Binary, got.Readable)
	}
	// Putting the same plan again (the caller's retry) is accepted.
	if _, err := s.PutPlan(ctx(t), plan); err != nil {
		t.Fatalf("PutPlan again: %v", err)
	}
}

// ReplaceHistory (a migration's write) in the same case keeps the chunks
// of the history it saved.
func TestAReplaceHistoryWhoseAnswerIsLostLeavesAReadableState(t *testing.T) {
	ns := env.Namespace(t)
	lossy := &lostAnswerClient{Client: env.Client}
	s := secrets.New(lossy, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	if _, err := s.Put(ctx(t), key, []byte(`{"version":4,"serial":1,"lineage":"l","resources":[]}`), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"version":4,"serial":7,"lineage":"l","resources":[]}`)
	lossy.lose = true
	err := s.ReplaceHistory(ctx(t), key, []state.State{{StateMeta: state.StateMeta{Version: 3, CreatedAt: time.Now()}, Data: data}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ReplaceHistory with its answer lost: %v, want the cancellation", err)
	}
	got, err := s.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("Get after a ReplaceHistory whose answer was lost: %v", err)
	}
	if got.Serial != 7 || !bytes.Equal(got.Data, data) {
		t.Fatalf("Get = serial %d, want the saved serial 7", got.Serial)
	}
}
