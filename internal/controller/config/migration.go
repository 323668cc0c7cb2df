package config

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state/migrate"
)

// Phases of status.stateBackend.phase.
const (
	MigrationMigrating = "Migrating"
	MigrationVerified  = "Verified"
	MigrationFailed    = "Failed"
)

// Reasons of a config whose state is moving.
const (
	// StateMigratingReason: waiting for runs to end before copying, or copying.
	StateMigratingReason = "StateMigrating"
	// StateMigrationFailedReason: a copy failed; it is retried every few seconds
	// and the source is untouched.
	StateMigrationFailedReason = "StateMigrationFailed"
	// StateMigratedReason (event): a namespace's state moved and was verified.
	StateMigratedReason = "StateMigrated"
)

// migrationRecheck is how soon a migration waiting for runs looks again.
const migrationRecheck = 5 * time.Second

// StateMigrator moves a namespace's state, plans and releases to the
// backend its config names, verified, before switching to it
// (internal/backend implements it). It reports where the state is after.
type StateMigrator interface {
	Locate(ctx context.Context, namespace string) (settings.StateLocation, error)
	MigrateNamespace(ctx context.Context, namespace string, log logr.Logger) (settings.StateLocation, migrate.Report, error)
}

// RunCounter counts runs in progress in a namespace (internal/launcher
// implements it): a namespace is copied only when none is.
type RunCounter interface {
	ActiveRuns(ctx context.Context, namespace string) (int, error)
}

// migrateState moves the state of every namespace whose backend this
// config decides to the backend it names, one namespace at a time, and
// reports progress in status.stateBackend.
func (r *Reconciler) migrateState(ctx context.Context, s *configScope) error {
	if r.Migrator == nil || s.effective == nil {
		return nil
	}
	governed, err := r.governedNamespaces(ctx, s.config)
	if err != nil {
		return err
	}
	desired := s.effective.StateBackend
	progress := &migrationProgress{desired: desired}
	for _, ns := range governed.namespaces() {
		before, loc, err := r.migrateNamespace(ctx, ns, governed[ns])
		progress.add(before, loc, governed[ns])
		if err != nil {
			s.migration = progress.report(err)
			return err
		}
	}
	s.migration = progress.report(nil)
	if progress.moved > 0 {
		r.Recorder.Eventf(s.config, nil, corev1.EventTypeNormal, StateMigratedReason, "Migrate", "%s", s.migration.Message)
	}
	return nil
}

// migrateNamespace migrates one namespace unless a run is in progress
// there, and says where its state was before and is after.
func (r *Reconciler) migrateNamespace(ctx context.Context, namespace string, stacks int) (before, after settings.StateLocation, err error) {
	before, err = r.Migrator.Locate(ctx, namespace)
	if err != nil || !before.Pending() {
		return before, before, err
	}
	if r.Runs != nil {
		active, err := r.Runs.ActiveRuns(ctx, namespace)
		if err != nil {
			return before, before, err
		}
		if active > 0 {
			// New runs wait for the migration; these started before it.
			return before, before, outcome.Waiting(StateMigratingReason, migrationRecheck,
				fmt.Errorf("waiting for %d run(s) in namespace %s to end before its state moves from %s to %s", active, namespace, before.Current, before.Desired))
		}
	}
	logger := log.FromContext(ctx).WithValues("namespace", namespace)
	started := time.Now()
	after, report, err := r.Migrator.MigrateNamespace(ctx, namespace, logger)
	if err != nil {
		return before, before, outcome.Waiting(StateMigrationFailedReason, migrationRecheck,
			fmt.Errorf("moving the state of namespace %s from %s to %s failed; the source is kept and the copy is retried: %w", namespace, before.Current, before.Desired, err))
	}
	logger.Info("moved the namespace's state", "from", before.Current, "to", after.Current, "stacks", stacks, "report", report.String(), "duration", time.Since(started).Round(time.Millisecond).String())
	return before, after, nil
}

// governed maps each namespace whose storage this config decides to its
// number of Stacks.
type governed map[string]int

func (g governed) namespaces() []string {
	out := make([]string, 0, len(g))
	for ns := range g {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

// governedNamespaces lists the namespaces with Stacks whose state backend
// comes from cfg: its own namespace when it names a backend, and, for the
// operator's config, every namespace that names none.
func (r *Reconciler) governedNamespaces(ctx context.Context, cfg *terracev1.TerraceConfig) (governed, error) {
	namespaces, err := r.stackNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	counts := governed{}
	for _, ns := range namespaces {
		counts[ns]++
	}
	self := cfg.Namespace + "/" + cfg.Name
	isDefault := cfg.Namespace == r.Resolver.OperatorNamespace
	out := governed{}
	for ns, n := range counts {
		eff, err := r.Resolver.ResolveNamespace(ctx, ns)
		if err != nil {
			return nil, err
		}
		if eff.StateBackendSource == self || (isDefault && eff.StateBackendSource == settings.BuiltinSource) {
			out[ns] = n
		}
	}
	return out, nil
}

// stackNamespaces is the namespace of every Stack, once per Stack: from
// the cache, or, when Stacks is set (a shard, whose cache holds its own
// Stacks only), from Stacks' metadata through it.
func (r *Reconciler) stackNamespaces(ctx context.Context) ([]string, error) {
	var out []string
	if r.Stacks != nil {
		stacks := &metav1.PartialObjectMetadataList{}
		stacks.SetGroupVersionKind(terracev1.GroupVersion.WithKind("StackList"))
		if err := r.Stacks.List(ctx, stacks); err != nil {
			return nil, fmt.Errorf("failed to list Stacks: %w", err)
		}
		for _, st := range stacks.Items {
			out = append(out, st.Namespace)
		}
		return out, nil
	}
	var stacks terracev1.StackList
	if err := r.Client.List(ctx, &stacks); err != nil {
		return nil, fmt.Errorf("failed to list Stacks: %w", err)
	}
	for _, st := range stacks.Items {
		out = append(out, st.Namespace)
	}
	return out, nil
}

// migrationProgress adds up where the governed namespaces' state is.
type migrationProgress struct {
	desired         terracev1.StateBackend
	from            terracev1.StateBackend
	migrated, total int32
	// moved counts the namespaces this reconcile moved.
	moved int
}

func (p *migrationProgress) add(before, after settings.StateLocation, stacks int) {
	p.total += int32(stacks)
	if before.Pending() && !after.Pending() {
		p.moved++
		p.from = before.Current
	}
	if after.Current != "" && !after.Pending() {
		p.migrated += int32(stacks)
		return
	}
	if after.Current != "" {
		p.from = after.Current
	}
}

// report is the status for what was seen; err is the step's error, if any.
func (p *migrationProgress) report(err error) *terracev1.StateBackendStatus {
	st := &terracev1.StateBackendStatus{Current: p.desired, Migrated: p.migrated, Total: p.total}
	if err == nil {
		if p.moved > 0 {
			st.Phase = MigrationVerified
			st.Message = fmt.Sprintf("state of %d Stack(s) moved from %s to %s and verified at %s", p.migrated, p.from, p.desired, time.Now().UTC().Format(time.RFC3339))
		}
		return st
	}
	st.Target = p.desired
	if p.from != "" {
		st.Current = p.from
	}
	st.Phase = MigrationMigrating
	var waiting *outcome.WaitingError
	if !errors.As(err, &waiting) || waiting.Reason == StateMigrationFailedReason {
		st.Phase = MigrationFailed
	}
	st.Message = err.Error()
	return st
}

// applyMigrationStatus writes what migrateState saw, keeping the record of
// the last completed migration.
func applyMigrationStatus(cfg *terracev1.TerraceConfig, previous *terracev1.StateBackendStatus, seen *terracev1.StateBackendStatus) {
	if seen == nil {
		return
	}
	st := seen.DeepCopy()
	if st.Phase == "" && previous != nil && previous.Phase == MigrationVerified && previous.Current == st.Current {
		// Keep saying how the state got here until the next move.
		st.Phase, st.Message = previous.Phase, previous.Message
	}
	cfg.Status.StateBackend = st
}
