package httpbackend

import "context"

// RunChecker decides whether a run is its Stack's current run: a runner's
// certificate opens the state only while it is.
type RunChecker interface {
	// IsCurrentRun reports whether runID is the current run of the Stack
	// and podUID the UID of its runner pod: the pod the run's certificate
	// was issued for (pki.PodUIDFromCertificate; "" is no pod, never current).
	IsCurrentRun(ctx context.Context, namespace, stack, runID, podUID string) (bool, error)
	// IsCurrentPullRequestRun is IsCurrentRun for a pull request's
	// plan-only run: one the Stack's status.pullRequests names.
	IsCurrentPullRequestRun(ctx context.Context, namespace, stack, runID, podUID string) (bool, error)
}
