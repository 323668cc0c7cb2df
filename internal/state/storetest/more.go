package storetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// Writers and IncrementsPerWriter size the concurrency test: 20 goroutines
// each land this many compare-and-swap increments.
const (
	Writers             = 20
	IncrementsPerWriter = 3
)

func testConcurrentWriters(t *testing.T, b Backend) {
	ctx := ctxFor(t, 5*time.Minute)
	key := state.Key{Namespace: b.Namespace, Stack: "race", Workspace: "default"}
	mustPut(t, b.States, key, StateJSON("race", 1, 0, 3000), state.PutOptions{IfMatch: state.Absent})

	var wg sync.WaitGroup
	errs := make(chan error, Writers)
	var conflicts sync.Map
	for w := range Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			landed, lost := 0, 0
			for landed < IncrementsPerWriter {
				cur, err := b.States.Get(ctx, key)
				if err != nil {
					errs <- fmt.Errorf("writer %d: Get: %w", w, err)
					return
				}
				n, err := Counter(cur.Data)
				if err != nil || int64(n) != cur.Serial-1 {
					errs <- fmt.Errorf("writer %d: torn state: counter %d, serial %d, %v", w, n, cur.Serial, err)
					return
				}
				_, err = b.States.Put(ctx, key, StateJSON("race", cur.Serial+1, n+1, 3000), state.PutOptions{IfMatch: cur.Version})
				var c *state.ConflictError
				switch {
				case err == nil:
					landed++
				case errors.As(err, &c) && c.Reason == state.ConflictVersion:
					lost++
				default:
					errs <- fmt.Errorf("writer %d: Put: %w", w, err)
					return
				}
			}
			conflicts.Store(w, lost)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	final, err := b.States.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Counter(final.Data)
	if err != nil || n != Writers*IncrementsPerWriter {
		t.Fatalf("final counter %d (%v), want %d: an update was lost", n, err, Writers*IncrementsPerWriter)
	}
	if final.Version != state.Version(Writers*IncrementsPerWriter+1) {
		t.Fatalf("final version %d, want %d", final.Version, Writers*IncrementsPerWriter+1)
	}
	totalLost := 0
	conflicts.Range(func(_, v any) bool { totalLost += v.(int); return true })
	if totalLost == 0 {
		t.Fatalf("no writer ever lost a compare-and-swap: the test did not exercise contention")
	}
	t.Logf("%d writers landed %d increments; %d attempts lost the compare-and-swap and retried", Writers, n, totalLost)
	versions, err := b.States.ListVersions(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		got, err := b.States.GetVersion(ctx, key, v.Version)
		if err != nil {
			t.Fatalf("GetVersion %d: %v", v.Version, err)
		}
		if c, err := Counter(got.Data); err != nil || int64(c) != got.Serial-1 {
			t.Fatalf("version %d is torn: counter %d serial %d", v.Version, c, got.Serial)
		}
	}
}

func testPlans(t *testing.T, b Backend) {
	ctx := ctxFor(t, 2*time.Minute)
	key := state.PlanKey{Namespace: b.Namespace, Stack: "app", ID: "p-1"}
	if _, err := b.Plans.GetPlan(ctx, key); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("GetPlan of a missing plan: got %v", err)
	}
	binary := StateJSON("plan", 1, 0, 2<<20) // bigger than one chunk
	readable := []byte(`{"resource_changes":[]}`)
	created := time.Now().UTC().Truncate(time.Second)
	decision := &state.PlanPolicy{Decision: "allowed", Warnings: []string{"terraform_data.x: discouraged"}, PoliciesDigest: "sha256:ab"}
	meta, err := b.Plans.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: key, ReadableFormat: state.ReadableJSON, CreatedAt: created, Policy: decision}, Binary: binary, Readable: readable})
	if err != nil {
		t.Fatalf("PutPlan: %v", err)
	}
	if meta.Digest != state.Digest(binary) || meta.ReadableDigest != state.Digest(readable) || meta.Size != int64(len(binary)) {
		t.Fatalf("PutPlan returned %+v", meta)
	}
	got, err := b.Plans.GetPlan(ctx, key)
	if err != nil {
		t.Fatalf("GetPlan: %v", err)
	}
	if !bytes.Equal(got.Binary, binary) || !bytes.Equal(got.Readable, readable) || got.ReadableFormat != state.ReadableJSON || !got.CreatedAt.Equal(created) {
		t.Fatalf("GetPlan returned other contents: %+v", got.PlanMeta)
	}
	if !reflect.DeepEqual(got.Policy, decision) || !reflect.DeepEqual(meta.Policy, decision) {
		t.Fatalf("the policy decision is not kept with the plan: put %+v, got %+v (PutPlan said %+v)", decision, got.Policy, meta.Policy)
	}
	if _, err := b.Plans.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: key, ReadableFormat: state.ReadableJSON}, Binary: binary, Readable: readable}); err != nil {
		t.Fatalf("repeating PutPlan with the same bytes: %v", err)
	}
	_, err = b.Plans.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: key}, Binary: []byte("other")})
	wantConflict(t, err, state.ConflictPlan)

	second := state.PlanKey{Namespace: b.Namespace, Stack: "app", ID: "p-2"}
	if _, err := b.Plans.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: second, CreatedAt: created.Add(time.Second)}, Binary: []byte("small plan")}); err != nil {
		t.Fatal(err)
	}
	otherStack := state.PlanKey{Namespace: b.Namespace, Stack: "db", ID: "p-1"}
	if _, err := b.Plans.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: otherStack}, Binary: []byte("db plan")}); err != nil {
		t.Fatal(err)
	}
	list, err := b.Plans.ListPlans(ctx, b.Namespace, "app")
	if err != nil || len(list) != 2 || list[0].Key != key || list[1].Key != second {
		t.Fatalf("ListPlans of a stack: %+v, %v", list, err)
	}
	if !reflect.DeepEqual(list[0].Policy, decision) || list[1].Policy != nil {
		t.Fatalf("ListPlans policy decisions: %+v and %+v, want %+v and none", list[0].Policy, list[1].Policy, decision)
	}
	if all, err := b.Plans.ListPlans(ctx, b.Namespace, ""); err != nil || len(all) != 3 {
		t.Fatalf("ListPlans of the namespace: %d plans, %v", len(all), err)
	}
	got, err = b.Plans.GetPlan(ctx, second)
	if err != nil || got.Readable != nil || !bytes.Equal(got.Binary, []byte("small plan")) {
		t.Fatalf("plan without a readable form: %+v, %v", got, err)
	}
	mark := &state.MigrationMark{To: "secrets", At: created}
	if err := b.Plans.MarkPlanMigrated(ctx, second, mark); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Plans.GetPlan(ctx, second); err != nil || got.Migrated == nil || got.Migrated.To != "secrets" {
		t.Fatalf("migration mark of a plan: %+v, %v", got, err)
	}
	if err := b.Plans.DeletePlan(ctx, key); err != nil {
		t.Fatalf("DeletePlan: %v", err)
	}
	if err := b.Plans.DeletePlan(ctx, key); err != nil {
		t.Fatalf("DeletePlan of a deleted plan: %v", err)
	}
	if _, err := b.Plans.GetPlan(ctx, key); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("GetPlan after DeletePlan: %v", err)
	}
}

func testReleases(t *testing.T, b Backend) {
	ctx := ctxFor(t, time.Minute)
	h := release.History{Store: b.Releases, Limit: 3}
	if latest, err := h.Latest(ctx, b.Namespace, "app"); err != nil || latest != nil {
		t.Fatalf("Latest with no releases: %+v, %v", latest, err)
	}
	start := time.Now().UTC().Truncate(time.Second)
	base := release.Release{
		Namespace: b.Namespace, Stack: "app", SourceRevision: "sha256:abc", PlanID: "p-1",
		Plan:      release.PlanSummary{Add: 2, Change: 1},
		Outputs:   []release.Output{{Name: "url", Value: json.RawMessage(`"https://x"`)}, {Name: "password", Sensitive: true, Value: json.RawMessage(`"hunter2"`)}},
		StartedAt: start, FinishedAt: start.Add(time.Minute), ToolVersion: "tofu 1.12.6",
	}
	r1 := base
	r1.Status = release.StatusDeployed
	rec, err := h.Record(ctx, r1)
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	if rec.Revision != 1 {
		t.Fatalf("first revision is %d", rec.Revision)
	}
	got, err := b.Releases.GetRelease(ctx, b.Namespace, "app", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Outputs[1].Value != nil || string(got.Outputs[0].Value) != `"https://x"` || got.Plan != r1.Plan || !got.StartedAt.Equal(start) || got.ToolVersion != "tofu 1.12.6" || got.SourceRevision != "sha256:abc" {
		t.Fatalf("stored release: %+v", got)
	}
	r2 := base
	r2.Status = release.StatusFailed
	r2.Message = "apply failed"
	if _, err := h.Record(ctx, r2); err != nil {
		t.Fatal(err)
	}
	r3 := base
	r3.Status = release.StatusDeployed
	if rec, err = h.Record(ctx, r3); err != nil || rec.Revision != 3 {
		t.Fatalf("third Record: %+v, %v", rec, err)
	}
	all, err := h.List(ctx, b.Namespace, "app")
	if err != nil {
		t.Fatal(err)
	}
	statuses := []release.Status{}
	for _, r := range all {
		statuses = append(statuses, r.Status)
	}
	if fmt.Sprint(statuses) != fmt.Sprint([]release.Status{release.StatusSuperseded, release.StatusFailed, release.StatusDeployed}) {
		t.Fatalf("statuses %v", statuses)
	}
	for range 3 {
		r := base
		r.Status = release.StatusDeployed
		if _, err := h.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	all, err = h.List(ctx, b.Namespace, "app")
	if err != nil || len(all) != 3 || all[0].Revision != 4 || all[2].Revision != 6 || all[2].Status != release.StatusDeployed {
		t.Fatalf("after pruning to 3: %+v, %v", all, err)
	}
	deployed, err := h.Deployed(ctx, b.Namespace, "app")
	if err != nil || deployed == nil || deployed.Revision != 6 {
		t.Fatalf("Deployed: %+v, %v", deployed, err)
	}
	dup := base
	dup.Revision, dup.Status = 6, release.StatusFailed
	wantConflict(t, b.Releases.CreateRelease(ctx, &dup), state.ConflictExists)
	if err := b.Releases.MarkReleaseMigrated(ctx, b.Namespace, "app", 6, &state.MigrationMark{To: "postgres", At: start}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Releases.GetRelease(ctx, b.Namespace, "app", 6); err != nil || got.Migrated == nil || got.Migrated.To != "postgres" {
		t.Fatalf("release mark: %+v, %v", got, err)
	}
	other := base
	other.Stack, other.Status = "db", release.StatusDeployed
	if _, err := h.Record(ctx, other); err != nil {
		t.Fatal(err)
	}
	if ns, err := b.Releases.ListReleases(ctx, b.Namespace, ""); err != nil || len(ns) != 4 {
		t.Fatalf("ListReleases of the namespace: %d, %v", len(ns), err)
	}
	if err := h.DeleteAll(ctx, b.Namespace, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Releases.GetRelease(ctx, b.Namespace, "app", 6); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("GetRelease after DeleteAll: %v", err)
	}
}
