package migrate_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

var (
	env   *testenv.Env
	dbURL string
)

func TestMain(m *testing.M) {
	url, stop, err := pgtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dbURL = url
	code := 1
	func() {
		defer stop()
		e, err := testenv.Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
		env = e
		defer func() { _ = e.Stop() }()
		code = m.Run()
	}()
	os.Exit(code)
}

func encryptionKey(t *testing.T) *state.EncryptionKey {
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	k, err := state.ParseEncryptionKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func backends(t *testing.T) (migrate.Backend, migrate.Backend) {
	t.Helper()
	sec := secrets.New(env.Client, secrets.Options{History: 3, Keys: state.StaticKey(encryptionKey(t))})
	pg, err := postgres.Open(context.Background(), dbURL, postgres.Options{History: 3, Keys: state.StaticKey(encryptionKey(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return migrate.Backend{Name: "secrets", States: sec, Plans: sec, Releases: sec},
		migrate.Backend{Name: "postgres", States: pg, Plans: pg, Releases: pg}
}

// snapshot is everything a backend holds in a namespace, by digest.
type snapshot struct {
	states   map[state.Key][]state.StateMeta
	plans    map[state.PlanKey]string
	releases map[string]string
}

func take(t *testing.T, b migrate.Backend, ns string) snapshot {
	t.Helper()
	ctx := context.Background()
	s := snapshot{states: map[state.Key][]state.StateMeta{}, plans: map[state.PlanKey]string{}, releases: map[string]string{}}
	keys, err := b.States.List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		metas, err := b.States.ListVersions(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range metas {
			// Read every version: this verifies every chunk and digest.
			v, err := b.States.GetVersion(ctx, k, m.Version)
			if err != nil {
				t.Fatalf("%s: %s version %d: %v", b.Name, k, m.Version, err)
			}
			if v.Digest != state.Digest(v.Data) {
				t.Fatalf("%s: %s version %d digest mismatch", b.Name, k, m.Version)
			}
		}
		s.states[k] = metas
	}
	plans, err := b.Plans.ListPlans(ctx, ns, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		full, err := b.Plans.GetPlan(ctx, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		s.plans[p.Key] = state.Digest(full.Binary) + "/" + full.ReadableDigest
	}
	rels, err := b.Releases.ListReleases(ctx, ns, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range rels {
		s.releases[fmt.Sprintf("%s/%d", rels[i].Stack, rels[i].Revision)] = release.Digest(&rels[i])
	}
	return s
}

func (s snapshot) equal(o snapshot) error {
	if len(s.states) != len(o.states) || len(s.plans) != len(o.plans) || len(s.releases) != len(o.releases) {
		return fmt.Errorf("counts differ: states %d/%d plans %d/%d releases %d/%d", len(s.states), len(o.states), len(s.plans), len(o.plans), len(s.releases), len(o.releases))
	}
	for k, metas := range s.states {
		other := o.states[k]
		if len(other) != len(metas) {
			return fmt.Errorf("state %s: %d versions vs %d", k, len(metas), len(other))
		}
		for i := range metas {
			a, b := metas[i], other[i]
			if a.Version != b.Version || a.Digest != b.Digest || a.Serial != b.Serial || a.Lineage != b.Lineage || !a.CreatedAt.Equal(b.CreatedAt) {
				return fmt.Errorf("state %s version %d differs: %+v vs %+v", k, a.Version, a, b)
			}
		}
	}
	for k, d := range s.plans {
		if o.plans[k] != d {
			return fmt.Errorf("plan %s differs", k)
		}
	}
	for k, d := range s.releases {
		if o.releases[k] != d {
			return fmt.Errorf("release %s differs", k)
		}
	}
	return nil
}

const stacks = 50

func seed(t *testing.T, b migrate.Backend, ns string) {
	t.Helper()
	ctx := context.Background()
	h := release.History{Store: b.Releases, Limit: 5}
	for i := range stacks {
		stack := fmt.Sprintf("stack-%02d", i)
		key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
		size := 2000
		if i%10 == 0 {
			size = 1500 << 10 // two chunks in Secrets
		}
		for serial := int64(1); serial <= 4; serial++ { // history 3: versions 2..4 remain
			if _, err := b.States.Put(ctx, key, storetest.StateJSON("lin-"+stack, serial, int(serial), size), state.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, status := range []release.Status{release.StatusDeployed, release.StatusFailed} {
			if _, err := h.Record(ctx, release.Release{Namespace: ns, Stack: stack, Status: status, SourceRevision: "rev-" + stack, Plan: release.PlanSummary{Add: i}, StartedAt: time.Now(), FinishedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		if i%5 == 0 {
			plan := state.Plan{PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: stack, ID: "plan-" + stack}, ReadableFormat: state.ReadableJSON}, Binary: storetest.StateJSON("p", 1, i, 4000), Readable: []byte(`{"changes":` + fmt.Sprint(i) + `}`)}
			if _, err := b.Plans.PutPlan(ctx, plan); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// failingStates fails ReplaceHistory after `allowed` successful calls, or
// cancels the migration's context at that point, like a crash mid-way.
type failingStates struct {
	state.Store
	allowed int32
	calls   atomic.Int32
	cancel  context.CancelFunc
}

func (f *failingStates) ReplaceHistory(ctx context.Context, key state.Key, versions []state.State) error {
	if err := f.intercept(ctx); err != nil {
		return err
	}
	return f.Store.ReplaceHistory(ctx, key, versions)
}

func (f *failingStates) intercept(ctx context.Context) error {
	if f.calls.Add(1) > f.allowed {
		if f.cancel != nil {
			f.cancel()
			return ctx.Err()
		}
		return errors.New("injected failure: the destination went away")
	}
	return nil
}

func countMarked(t *testing.T, b migrate.Backend, ns string) (marked, locked int) {
	t.Helper()
	keys, err := b.States.List(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if m, err := b.States.Migrated(context.Background(), k); err != nil {
			t.Fatal(err)
		} else if m != nil {
			marked++
		}
		if l, err := b.States.GetLock(context.Background(), k); err != nil {
			t.Fatal(err)
		} else if l != nil {
			locked++
		}
	}
	return marked, locked
}

// Secrets → PostgreSQL → Secrets for 50 Stacks with history, plans and
// releases: lossless by digest, and each leg survives interruption.
func TestMigrationRoundTripIsLosslessAndResumable(t *testing.T) {
	ns := env.Namespace(t)
	sec, pg := backends(t)
	seed(t, sec, ns)
	original := take(t, sec, ns)
	if len(original.states) != stacks || len(original.plans) != stacks/5 || len(original.releases) != 2*stacks {
		t.Fatalf("seeded %d states, %d plans, %d releases", len(original.states), len(original.plans), len(original.releases))
	}
	ctx := context.Background()
	opts := migrate.Options{Namespace: ns}

	// Leg 1, first attempt: the destination fails after 20 states.
	broken := pg
	broken.States = &failingStates{Store: pg.States, allowed: 20}
	report, err := migrate.Migrate(ctx, sec, broken, opts)
	if err == nil || report.States != 20 {
		t.Fatalf("interrupted migration: report %v, err %v", report, err)
	}
	if marked, locked := countMarked(t, sec, ns); marked != 20 || locked != 0 {
		t.Fatalf("after the failure %d sources are marked (want 20) and %d locked (want 0)", marked, locked)
	}
	// Second attempt: the context is cancelled mid-way.
	cancelCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	broken.States = &failingStates{Store: pg.States, allowed: 10, cancel: cancel}
	report, err = migrate.Migrate(cancelCtx, sec, broken, opts)
	if !errors.Is(err, context.Canceled) || report.States != 10 || report.StatesSkipped != 20 {
		t.Fatalf("cancelled migration: report %v, err %v", report, err)
	}
	// Third attempt completes what is left.
	report, err = migrate.Migrate(ctx, sec, pg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if report.States != stacks-30 || report.StatesSkipped != 30 || report.Plans != stacks/5 || report.Releases != 2*stacks {
		t.Fatalf("resumed migration: %v", report)
	}
	if got := take(t, pg, ns); original.equal(got) != nil {
		t.Fatalf("postgres copy differs from the Secrets original: %v", original.equal(got))
	}
	// Rerunning does nothing.
	if report, err = migrate.Migrate(ctx, sec, pg, opts); err != nil || report.States+report.Plans+report.Releases != 0 || report.StatesSkipped != stacks {
		t.Fatalf("rerun: %v, %v", report, err)
	}
	// The migrated source refuses writes.
	key := state.Key{Namespace: ns, Stack: "stack-00", Workspace: "default"}
	if _, err := sec.States.Put(ctx, key, storetest.StateJSON("lin-stack-00", 9, 9, 10), state.PutOptions{}); !errors.Is(err, state.ErrMigrated) {
		t.Fatalf("write to a migrated Secrets state: %v", err)
	}

	// Leg 2: back to Secrets, from PostgreSQL alone: the Secrets are wiped
	// first (as on a new cluster), so every byte comes from the copy.
	wipe(t, sec, ns)
	if n := len(take(t, sec, ns).states); n != 0 {
		t.Fatalf("%d states left after wiping Secrets", n)
	}
	cancelCtx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	brokenSec := sec
	brokenSec.States = &failingStates{Store: sec.States, allowed: 25, cancel: cancel2}
	if _, err := migrate.Migrate(cancelCtx2, pg, brokenSec, opts); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted second leg: %v", err)
	}
	if report, err = migrate.Migrate(ctx, pg, sec, opts); err != nil {
		t.Fatal(err)
	}
	if report.States+report.StatesSkipped != stacks {
		t.Fatalf("second leg: %v", report)
	}
	back := take(t, sec, ns)
	if err := original.equal(back); err != nil {
		t.Fatalf("Secrets after the round trip differ from the original: %v", err)
	}
	if marked, locked := countMarked(t, sec, ns); marked != 0 || locked != 0 {
		t.Fatalf("Secrets after the round trip: %d marked, %d locked", marked, locked)
	}
	if marked, _ := countMarked(t, pg, ns); marked != stacks {
		t.Fatalf("postgres after the round trip: %d of %d marked migrated", marked, stacks)
	}
	// Secrets is authoritative again.
	if _, err := sec.States.Put(ctx, key, storetest.StateJSON("lin-stack-00", 5, 5, 10), state.PutOptions{}); err != nil {
		t.Fatalf("write after migrating back: %v", err)
	}
}

func wipe(t *testing.T, b migrate.Backend, ns string) {
	t.Helper()
	ctx := context.Background()
	keys, err := b.States.List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := b.States.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	plans, err := b.Plans.ListPlans(ctx, ns, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		if err := b.Plans.DeletePlan(ctx, p.Key); err != nil {
			t.Fatal(err)
		}
	}
	if err := (release.History{Store: b.Releases}).DeleteAllInNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
}

// A state locked by a run is not migrated behind its back.
func TestMigrationRefusesLockedState(t *testing.T) {
	ns := env.Namespace(t)
	sec, pg := backends(t)
	key := state.Key{Namespace: ns, Stack: "busy", Workspace: "default"}
	ctx := context.Background()
	if _, err := sec.States.Put(ctx, key, storetest.StateJSON("l", 1, 0, 10), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sec.States.Lock(ctx, key, state.LockInfo{ID: "run-1", Operation: "OperationTypeApply", Who: "runner"}); err != nil {
		t.Fatal(err)
	}
	_, err := migrate.Migrate(ctx, sec, pg, migrate.Options{Namespace: ns})
	var locked *state.LockedError
	if !errors.As(err, &locked) || locked.Holder.ID != "run-1" {
		t.Fatalf("migration of a locked state: %v", err)
	}
	if m, _ := sec.States.Migrated(ctx, key); m != nil {
		t.Fatal("a locked state was marked migrated")
	}
}
