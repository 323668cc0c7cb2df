// Package integration tests the CA Secret against a real API server.
package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/pki/casecret"
	"github.com/terrace-dev/terrace/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// replica is one controller replica's view: its own client, as separate processes would have.
func replica(t *testing.T, key types.NamespacedName) *casecret.Store {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &casecret.Store{Client: c, Key: key}
}

// together runs fn on n goroutines released at the same moment and waits for all.
func together(n int, fn func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// TestConcurrentLoadOrCreateConvergesOnOneCA: replicas starting together
// end with the single CA that is stored.
func TestConcurrentLoadOrCreateConvergesOnOneCA(t *testing.T) {
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := range 5 {
		key := types.NamespacedName{Namespace: ns, Name: "terrace-ca-" + string(rune('a'+round))}
		const replicas = 3
		stores := make([]*casecret.Store, replicas)
		for i := range stores {
			stores[i] = replica(t, key)
		}
		authorities := make([]*pki.Authority, replicas)
		errs := make([]error, replicas)
		together(replicas, func(i int) { authorities[i], errs[i] = stores[i].LoadOrCreate(ctx, pki.Options{}) })

		secret := &corev1.Secret{}
		if err := env.Client.Get(ctx, key, secret); err != nil {
			t.Fatal(err)
		}
		for i := range replicas {
			if errs[i] != nil {
				t.Fatalf("round %d replica %d: %v", round, i, errs[i])
			}
			cur, prev := authorities[i].CAs()
			if string(cur.CertPEM()) != string(secret.Data[casecret.SecretKeyCACert]) || prev != nil {
				t.Fatalf("round %d: replica %d holds a CA other than the stored one", round, i)
			}
		}
	}
}

// TestConcurrentRotationRotatesOnce: two writers that both find rotation due
// produce one new CA, and a replica running Sync picks it up.
func TestConcurrentRotationRotatesOnce(t *testing.T) {
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := types.NamespacedName{Namespace: ns, Name: "terrace-ca"}
	var clockMu sync.Mutex
	now := time.Now()
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	opts := pki.Options{Clock: clock}

	stores := []*casecret.Store{replica(t, key), replica(t, key), replica(t, key)}
	authorities := make([]*pki.Authority, len(stores))
	for i, s := range stores {
		a, err := s.LoadOrCreate(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		authorities[i] = a
	}
	original, _ := authorities[0].CAs()

	// The third replica only follows the Secret.
	syncCtx, stopSync := context.WithCancel(ctx)
	syncDone := make(chan error, 1)
	go func() {
		syncDone <- (&casecret.Sync{Store: stores[2], Authority: authorities[2], Interval: 50 * time.Millisecond}).Start(syncCtx)
	}()
	defer func() {
		stopSync()
		if err := <-syncDone; err != nil {
			t.Errorf("sync: %v", err)
		}
	}()

	clockMu.Lock()
	now = now.Add(300 * 24 * time.Hour)
	clockMu.Unlock()
	rotated := make([]bool, 2)
	errs := make([]error, 2)
	together(2, func(i int) {
		rotated[i], errs[i] = stores[i].RotateIfDue(ctx, authorities[i], casecret.DefaultRotateWhenRemaining)
	})
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("writer %d: %v", i, errs[i])
		}
	}
	if rotated[0] == rotated[1] {
		t.Fatalf("want exactly one rotation, got %v", rotated)
	}
	c0, p0 := authorities[0].CAs()
	c1, p1 := authorities[1].CAs()
	if c0.Equal(original) || !c0.Equal(c1) || !p0.Equal(original) || !p1.Equal(original) {
		t.Fatal("writers disagree on the rotated CAs")
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		c2, p2 := authorities[2].CAs()
		if c2.Equal(c0) && p2.Equal(original) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the following replica did not pick up the rotated CA")
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
