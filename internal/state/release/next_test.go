package release_test

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// memReleases is a release.Store in memory that counts its listings.
type memReleases struct {
	records map[int]release.Release
	lists   int
}

func (m *memReleases) CreateRelease(_ context.Context, r *release.Release) error {
	if _, ok := m.records[r.Revision]; ok {
		return &state.ConflictError{Reason: state.ConflictExists, Key: fmt.Sprint(r.Revision)}
	}
	m.records[r.Revision] = *r
	return nil
}

func (m *memReleases) UpdateRelease(_ context.Context, r *release.Release) error {
	if _, ok := m.records[r.Revision]; !ok {
		return &state.NotFoundError{What: fmt.Sprint(r.Revision)}
	}
	m.records[r.Revision] = *r
	return nil
}

func (m *memReleases) GetRelease(_ context.Context, _, _ string, revision int) (*release.Release, error) {
	r, ok := m.records[revision]
	if !ok {
		return nil, &state.NotFoundError{What: fmt.Sprint(revision)}
	}
	return &r, nil
}

func (m *memReleases) ListReleases(context.Context, string, string) ([]release.Release, error) {
	m.lists++
	var out []release.Release
	for _, r := range m.records {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out, nil
}

func (m *memReleases) DeleteRelease(_ context.Context, _, _ string, revision int) error {
	delete(m.records, revision)
	return nil
}

func (m *memReleases) MarkReleaseMigrated(context.Context, string, string, int, *state.MigrationMark) error {
	return nil
}

// statuses renders the records as "1:superseded 2:deployed".
func (m *memReleases) statuses() string {
	all, _ := m.ListReleases(context.Background(), "", "")
	m.lists--
	s := ""
	for _, r := range all {
		s += fmt.Sprintf("%d:%s ", r.Revision, r.Status)
	}
	return s
}

func TestRecordAfterWritesWithoutListing(t *testing.T) {
	ctx := context.Background()
	store := &memReleases{records: map[int]release.Release{}}
	h := release.History{Store: store, Limit: 3}
	rel := func(status release.Status) release.Release {
		return release.Release{Namespace: "team", Stack: "web", Status: status}
	}
	var prev release.Previous
	for range 5 {
		rec, err := h.RecordAfter(ctx, rel(release.StatusDeployed), prev)
		if err != nil {
			t.Fatal(err)
		}
		prev = release.Previous{Revision: rec.Revision, Deployed: true}
	}
	if got, want := store.statuses(), "3:superseded 4:superseded 5:deployed "; got != want || store.lists != 0 {
		t.Fatalf("after 5 deployed releases: %q with %d lists, want %q with none", got, store.lists, want)
	}

	// Failed applies after the deployed one: still no listing, and the
	// deployed record outlives the prune however many fail.
	for range 4 {
		rec, err := h.RecordAfter(ctx, rel(release.StatusFailed), prev)
		if err != nil {
			t.Fatal(err)
		}
		prev = release.Previous{Revision: rec.Revision}
	}
	if got, want := store.statuses(), "5:deployed 7:failed 8:failed 9:failed "; got != want || store.lists != 0 {
		t.Fatalf("after 4 failed releases: %q with %d lists, want %q with none", got, store.lists, want)
	}

	// A deployed release after failed ones must find the deployed record
	// to supersede: the one case, with a lost status, that lists (and
	// prunes to the limit, 5 now superseded).
	rec, err := h.RecordAfter(ctx, rel(release.StatusDeployed), prev)
	if err != nil || rec.Revision != 10 {
		t.Fatalf("deployed after failures: %+v, %v", rec, err)
	}
	if got := store.statuses(); got != "8:failed 9:failed 10:deployed " || store.lists != 1 {
		t.Fatalf("deployed after failures: %q with %d lists", got, store.lists)
	}
}

// The status patch that named release 10 was lost: the next release is
// recorded after what the status still says (9), finds 10 taken, and
// becomes 11, superseding 10.
func TestRecordAfterAStatusThatFellBehind(t *testing.T) {
	ctx := context.Background()
	store := &memReleases{records: map[int]release.Release{
		9:  {Namespace: "team", Stack: "web", Revision: 9, Status: release.StatusSuperseded},
		10: {Namespace: "team", Stack: "web", Revision: 10, Status: release.StatusDeployed},
	}}
	h := release.History{Store: store}
	rec, err := h.RecordAfter(ctx, release.Release{Namespace: "team", Stack: "web", Status: release.StatusDeployed}, release.Previous{Revision: 9, Deployed: true})
	if err != nil || rec.Revision != 11 {
		t.Fatalf("RecordAfter: %+v, %v; want revision 11", rec, err)
	}
	if got := store.statuses(); got != "9:superseded 10:superseded 11:deployed " {
		t.Fatalf("records %q: exactly one deployed, the newest", got)
	}
}
