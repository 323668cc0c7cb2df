package casecret

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/terrace-dev/terrace/internal/pki"
)

const (
	// DefaultRotateWhenRemaining rotates a CA when less than this fraction of its lifetime is left.
	DefaultRotateWhenRemaining = 1.0 / 3
	// DefaultSyncInterval is how often replicas re-read the CA Secret and the
	// leader checks whether rotation is due.
	DefaultSyncInterval = time.Minute
)

// rotationDue reports whether ca has less than fraction of its lifetime left at now.
func rotationDue(ca *pki.CA, now time.Time, fraction float64) bool {
	notAfter := ca.Certificate().NotAfter
	return float64(notAfter.Sub(now)) < float64(notAfter.Sub(ca.Created()))*fraction
}

// checkRotationFraction refuses fractions that would drop a previous CA that
// is still valid, or leave too little overlap for new leaves to spread.
func checkRotationFraction(fraction float64, opts pki.Options) error {
	if fraction <= 0 || fraction > 0.5 {
		return fmt.Errorf("rotation threshold %v must be in (0, 0.5] so the CA two rotations back has expired", fraction)
	}
	if overlap := time.Duration(float64(opts.CAValidity) * fraction); overlap <= opts.ActivationDelay+opts.MaxLeafValidity {
		return fmt.Errorf("rotation threshold %v leaves an overlap of %s, which must exceed activation delay plus maximum leaf validity (%s)", fraction, overlap, opts.ActivationDelay+opts.MaxLeafValidity)
	}
	return nil
}

// RotateIfDue replaces the current CA with a new one when less than fraction
// of its lifetime is left, keeping the old one as previous so both are
// trusted until it expires. The write is a compare-and-swap: when another
// writer got there first, its CAs are adopted instead. a ends up holding
// what the Secret holds either way.
func (s *Store) RotateIfDue(ctx context.Context, a *pki.Authority, fraction float64) (rotated bool, err error) {
	opts := a.Options()
	if err := checkRotationFraction(fraction, opts); err != nil {
		return false, err
	}
	for range maxConflictRetries {
		stored, err := s.get(ctx)
		if err != nil {
			return false, err
		}
		if stored.current == nil {
			return false, fmt.Errorf("CA Secret %s is missing or empty", s.Key)
		}
		now := opts.Clock()
		if !rotationDue(stored.current, now, fraction) {
			return false, setCAs(a, stored.current, stored.previous)
		}
		next, err := pki.GenerateCA(opts.CAValidity, now)
		if err != nil {
			return false, err
		}
		// The CA before current has expired by now (fraction <= 1/2), so dropping it loses nothing.
		err = s.put(ctx, stored, next, stored.current)
		if err == nil {
			return true, setCAs(a, next, stored.current)
		}
		if !lostRace(err) {
			return false, fmt.Errorf("failed to store rotated CA in Secret %s: %w", s.Key, err)
		}
	}
	return false, fmt.Errorf("failed to rotate CA Secret %s: it kept changing under %d attempts", s.Key, maxConflictRetries)
}

// Sync is a manager.Runnable for every replica: it keeps the Authority
// equal to the CA Secret, so leaves issued by whichever replica rotated are
// trusted everywhere.
type Sync struct {
	Store     *Store
	Authority *pki.Authority
	// Interval between reads; DefaultSyncInterval when zero.
	Interval time.Duration
}

var _ manager.LeaderElectionRunnable = (*Sync)(nil)

// NeedLeaderElection is false: every replica serves TLS and needs the CAs.
func (r *Sync) NeedLeaderElection() bool { return false }

// Start re-reads the Secret every Interval until ctx ends.
func (r *Sync) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("pki").WithValues("secret", r.Store.Key.String())
	return every(ctx, interval(r.Interval), func() {
		changed, err := r.Store.Reload(ctx, r.Authority)
		if err != nil {
			logger.Error(err, "failed to reload CA secret")
			return
		}
		if changed {
			logger.Info("reloaded CAs from secret")
		}
	})
}

// Rotation is a manager.Runnable for the leader: it rotates the CA in the
// Secret before it expires.
type Rotation struct {
	Store     *Store
	Authority *pki.Authority
	// RotateWhenRemaining is the fraction of a CA's lifetime left when it is
	// rotated; DefaultRotateWhenRemaining when zero.
	RotateWhenRemaining float64
	// Interval between checks; DefaultSyncInterval when zero.
	Interval time.Duration
}

var _ manager.LeaderElectionRunnable = (*Rotation)(nil)

// NeedLeaderElection is true: one writer rotates, the others adopt the result.
func (r *Rotation) NeedLeaderElection() bool { return true }

// Start checks at once and then every Interval until ctx ends.
func (r *Rotation) Start(ctx context.Context) error {
	fraction := r.RotateWhenRemaining
	if fraction == 0 {
		fraction = DefaultRotateWhenRemaining
	}
	if err := checkRotationFraction(fraction, r.Authority.Options()); err != nil {
		return err
	}
	logger := log.FromContext(ctx).WithName("pki").WithValues("secret", r.Store.Key.String())
	return every(ctx, interval(r.Interval), func() {
		rotated, err := r.Store.RotateIfDue(ctx, r.Authority, fraction)
		if err != nil {
			logger.Error(err, "failed to rotate CA")
			return
		}
		if rotated {
			current, _ := r.Authority.CAs()
			logger.Info("rotated CA", "notAfter", current.Certificate().NotAfter)
		}
	})
}

// AddToManager adds the sync (all replicas) and rotation (leader) runnables.
func AddToManager(mgr manager.Manager, s *Store, a *pki.Authority, rotateWhenRemaining float64, syncInterval time.Duration) error {
	if err := mgr.Add(&Sync{Store: s, Authority: a, Interval: syncInterval}); err != nil {
		return fmt.Errorf("failed to add CA sync: %w", err)
	}
	if err := mgr.Add(&Rotation{Store: s, Authority: a, RotateWhenRemaining: rotateWhenRemaining, Interval: syncInterval}); err != nil {
		return fmt.Errorf("failed to add CA rotation: %w", err)
	}
	return nil
}

func interval(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultSyncInterval
	}
	return d
}

// every runs fn now and then every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) error {
	ticker := time.NewTicker(d)
	defer ticker.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
