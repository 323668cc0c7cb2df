// Package migrate copies every state (with its history), saved plan and
// release record from one backend to another, verifies each copy byte for
// byte (by digest), and only then marks the source entry migrated. Marked
// entries are skipped, so re-running is safe and an interrupted run resumes
// where it stopped. It also adopts tofu-controller state Secrets.
//
// While a state is copied the source holds a migration lock, so no run can
// write it in between; a lock left by an interrupted migration is taken over.
package migrate

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// Backend is one storage backend's stores.
type Backend struct {
	// Name is recorded in migration marks: "secrets" or "postgres".
	Name     string
	States   state.Store
	Plans    state.PlanStore
	Releases release.Store
}

// Options tune a migration.
type Options struct {
	// Namespace limits the migration to one namespace ("" = all).
	Namespace string
	Log       logr.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Report counts what a run did. Copied entries were written and verified in
// this run; Skipped ones were already migrated (or identical) before it.
type Report struct {
	States, StatesSkipped     int
	Versions                  int
	Plans, PlansSkipped       int
	Releases, ReleasesSkipped int
	Bytes                     int64
}

func (r Report) String() string {
	return fmt.Sprintf("states %d copied (%d versions, %d bytes) %d already done; plans %d copied %d already done; releases %d copied %d already done",
		r.States, r.Versions, r.Bytes, r.StatesSkipped, r.Plans, r.PlansSkipped, r.Releases, r.ReleasesSkipped)
}

// LockOperation marks locks taken by a migration, so a rerun can take
// over the lock of an interrupted one, and nothing else breaks them.
const LockOperation = "terrace-state-migrate"

// Migrate copies everything in opts.Namespace from one backend to the other.
// It stops at the first error; run it again to resume.
func Migrate(ctx context.Context, from, to Backend, opts Options) (Report, error) {
	if from.Name == "" || to.Name == "" || from.Name == to.Name {
		return Report{}, fmt.Errorf("migration needs two different named backends, got %q and %q", from.Name, to.Name)
	}
	m := &migration{from: from, to: to, opts: opts}
	if m.opts.Now == nil {
		m.opts.Now = time.Now
	}
	for _, step := range []func(context.Context) error{m.states, m.plans, m.releases} {
		if err := step(ctx); err != nil {
			return m.report, err
		}
	}
	m.opts.Log.Info("state migration finished", "from", from.Name, "to", to.Name, "namespace", opts.Namespace, "report", m.report.String())
	return m.report, nil
}

type migration struct {
	from, to Backend
	opts     Options
	report   Report
}

func (m *migration) mark() *state.MigrationMark {
	return &state.MigrationMark{To: m.to.Name, At: m.opts.Now().UTC().Truncate(time.Second)}
}

// alreadyMigrated says whether a source entry's mark means "done"; a mark
// towards a third backend means the source is stale.
func (m *migration) alreadyMigrated(what string, mark *state.MigrationMark) (bool, error) {
	if mark == nil {
		return false, nil
	}
	if mark.To != m.to.Name {
		return false, fmt.Errorf("%s in %s was migrated to %s: migrate from there instead", what, m.from.Name, mark.To)
	}
	return true, nil
}

func (m *migration) states(ctx context.Context) error {
	keys, err := m.from.States.List(ctx, m.opts.Namespace)
	if err != nil {
		return fmt.Errorf("failed to list states in %s: %w", m.from.Name, err)
	}
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("state migration interrupted before %s: %w", key, err)
		}
		if err := m.state(ctx, key); err != nil {
			return fmt.Errorf("failed to migrate state %s: %w", key, err)
		}
	}
	return nil
}

func newLockID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "migrate-" + hex.EncodeToString(b)
}

func (m *migration) state(ctx context.Context, key state.Key) error {
	mark, err := m.from.States.Migrated(ctx, key)
	if err != nil {
		return err
	}
	if done, err := m.alreadyMigrated("state "+key.String(), mark); done || err != nil {
		if done {
			m.report.StatesSkipped++
		}
		return err
	}
	lockID, err := m.lockSource(ctx, key)
	if err != nil {
		return err
	}
	// Unlock even when ctx is done, so an interrupted run leaves no stray lock.
	defer func() { _ = m.from.States.Unlock(context.WithoutCancel(ctx), key, lockID) }()

	metas, err := m.from.States.ListVersions(ctx, key)
	if err != nil {
		return err
	}
	if len(metas) == 0 {
		// A key with only a lock or a mark has nothing to copy.
		m.report.StatesSkipped++
		return nil
	}
	history := make([]state.State, 0, len(metas))
	var size int64
	for i := len(metas) - 1; i >= 0; i-- {
		v, err := m.from.States.GetVersion(ctx, key, metas[i].Version)
		if err != nil {
			return fmt.Errorf("failed to read version %d from %s: %w", metas[i].Version, m.from.Name, err)
		}
		history = append(history, *v)
		size += int64(len(v.Data))
	}
	same, err := sameHistory(ctx, m.to.States, key, metas)
	if err != nil {
		return err
	}
	if !same {
		if err := m.to.States.ReplaceHistory(ctx, key, history); err != nil {
			return fmt.Errorf("failed to write to %s: %w", m.to.Name, err)
		}
	} else if err := m.to.States.MarkMigrated(ctx, key, nil); err != nil {
		return err
	}
	if err := verifyHistory(ctx, m.to.States, key, history); err != nil {
		return fmt.Errorf("copy in %s failed verification: %w", m.to.Name, err)
	}
	if err := m.from.States.MarkMigrated(ctx, key, m.mark()); err != nil {
		return fmt.Errorf("failed to mark the source migrated: %w", err)
	}
	m.report.States++
	m.report.Versions += len(history)
	m.report.Bytes += size
	m.opts.Log.V(1).Info("migrated state", "state", key.String(), "versions", len(history), "bytes", size)
	return nil
}

// lockSource takes the source's lock for the copy. A lock of an earlier,
// interrupted migration is taken over; any other holder stops the migration.
func (m *migration) lockSource(ctx context.Context, key state.Key) (string, error) {
	id := newLockID()
	info := state.LockInfo{ID: id, Operation: LockOperation, Who: "terrace state migrate", Info: "copying to " + m.to.Name, Created: m.opts.Now().UTC()}
	err := m.from.States.Lock(ctx, key, info)
	var locked *state.LockedError
	if errors.As(err, &locked) && locked.Holder != nil && locked.Holder.Operation == LockOperation && strings.HasPrefix(locked.Holder.ID, "migrate-") {
		if err := m.from.States.Unlock(ctx, key, locked.Holder.ID); err != nil {
			return "", err
		}
		err = m.from.States.Lock(ctx, key, info)
	}
	if err != nil {
		return "", fmt.Errorf("failed to lock the source (a run may be in progress; retry when it ends): %w", err)
	}
	return id, nil
}

// sameHistory reports whether dst already holds exactly these versions.
func sameHistory(ctx context.Context, dst state.Store, key state.Key, src []state.StateMeta) (bool, error) {
	have, err := dst.ListVersions(ctx, key)
	if err != nil {
		return false, err
	}
	if len(have) != len(src) {
		return false, nil
	}
	for i := range have {
		if have[i].Version != src[i].Version || have[i].Digest != src[i].Digest || !have[i].CreatedAt.Equal(src[i].CreatedAt) {
			return false, nil
		}
	}
	return true, nil
}

// verifyHistory reads every version back from dst and compares bytes and digests.
func verifyHistory(ctx context.Context, dst state.Store, key state.Key, history []state.State) error {
	have, err := dst.ListVersions(ctx, key)
	if err != nil {
		return err
	}
	if len(have) != len(history) {
		return fmt.Errorf("holds %d versions, the source %d", len(have), len(history))
	}
	for _, want := range history {
		got, err := dst.GetVersion(ctx, key, want.Version)
		if err != nil {
			return fmt.Errorf("version %d: %w", want.Version, err)
		}
		if got.Digest != state.Digest(want.Data) || !bytes.Equal(got.Data, want.Data) {
			return fmt.Errorf("version %d differs (digest %s, source %s)", want.Version, got.Digest, state.Digest(want.Data))
		}
	}
	return nil
}

func (m *migration) plans(ctx context.Context) error {
	metas, err := m.from.Plans.ListPlans(ctx, m.opts.Namespace, "")
	if err != nil {
		return fmt.Errorf("failed to list plans in %s: %w", m.from.Name, err)
	}
	for _, meta := range metas {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("plan migration interrupted before %s: %w", meta.Key, err)
		}
		if done, err := m.alreadyMigrated("plan "+meta.Key.String(), meta.Migrated); done || err != nil {
			if done {
				m.report.PlansSkipped++
			}
			if err != nil {
				return err
			}
			continue
		}
		if err := m.plan(ctx, meta.Key); err != nil {
			return fmt.Errorf("failed to migrate plan %s: %w", meta.Key, err)
		}
	}
	return nil
}

func (m *migration) plan(ctx context.Context, key state.PlanKey) error {
	src, err := m.from.Plans.GetPlan(ctx, key)
	if err != nil {
		return err
	}
	copyOf := *src
	copyOf.Migrated = nil
	if _, err := m.to.Plans.PutPlan(ctx, copyOf); err != nil {
		return fmt.Errorf("failed to write to %s: %w", m.to.Name, err)
	}
	got, err := m.to.Plans.GetPlan(ctx, key)
	if err != nil {
		return fmt.Errorf("failed to read the copy back from %s: %w", m.to.Name, err)
	}
	if got.Digest != src.Digest || got.ReadableDigest != src.ReadableDigest || !bytes.Equal(got.Binary, src.Binary) || !bytes.Equal(got.Readable, src.Readable) || got.ReadableFormat != src.ReadableFormat ||
		!reflect.DeepEqual(got.Policy, src.Policy) {
		return fmt.Errorf("copy in %s failed verification", m.to.Name)
	}
	if got.Migrated != nil {
		if err := m.to.Plans.MarkPlanMigrated(ctx, key, nil); err != nil {
			return err
		}
	}
	if err := m.from.Plans.MarkPlanMigrated(ctx, key, m.mark()); err != nil {
		return fmt.Errorf("failed to mark the source migrated: %w", err)
	}
	m.report.Plans++
	return nil
}

func (m *migration) releases(ctx context.Context) error {
	all, err := m.from.Releases.ListReleases(ctx, m.opts.Namespace, "")
	if err != nil {
		return fmt.Errorf("failed to list releases in %s: %w", m.from.Name, err)
	}
	for i := range all {
		r := &all[i]
		what := fmt.Sprintf("release %s/%s revision %d", r.Namespace, r.Stack, r.Revision)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("release migration interrupted before %s: %w", what, err)
		}
		if done, err := m.alreadyMigrated(what, r.Migrated); done || err != nil {
			if done {
				m.report.ReleasesSkipped++
			}
			if err != nil {
				return err
			}
			continue
		}
		if err := m.release(ctx, r); err != nil {
			return fmt.Errorf("failed to migrate %s: %w", what, err)
		}
	}
	return nil
}

func (m *migration) release(ctx context.Context, r *release.Release) error {
	want := release.Digest(r)
	copyOf := *r
	copyOf.Migrated = nil
	existing, err := m.to.Releases.GetRelease(ctx, r.Namespace, r.Stack, r.Revision)
	switch {
	case errors.Is(err, state.ErrNotFound):
		err = m.to.Releases.CreateRelease(ctx, &copyOf)
	case err == nil && release.Digest(existing) != want:
		err = m.to.Releases.UpdateRelease(ctx, &copyOf)
	}
	if err != nil {
		return fmt.Errorf("failed to write to %s: %w", m.to.Name, err)
	}
	got, err := m.to.Releases.GetRelease(ctx, r.Namespace, r.Stack, r.Revision)
	if err != nil {
		return fmt.Errorf("failed to read the copy back from %s: %w", m.to.Name, err)
	}
	if release.Digest(got) != want {
		return fmt.Errorf("copy in %s failed verification", m.to.Name)
	}
	if got.Migrated != nil {
		if err := m.to.Releases.MarkReleaseMigrated(ctx, r.Namespace, r.Stack, r.Revision, nil); err != nil {
			return err
		}
	}
	if err := m.from.Releases.MarkReleaseMigrated(ctx, r.Namespace, r.Stack, r.Revision, m.mark()); err != nil {
		return fmt.Errorf("failed to mark the source migrated: %w", err)
	}
	m.report.Releases++
	return nil
}
