package stack

import (
	"hash/fnv"
	"math"
	"time"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// One retry policy: a transient failure is retried after retryBackoff of
// the failure count stored in status.failures, as RequeueAfter (finish),
// so the Warning event, the status and the real delay agree, also after a
// controller restart. Requeues at the interval (drift checks) are
// jittered; retries are not, so that their delay is the one announced.

// retryBackoff is retryInterval doubled per consecutive failure, capped.
func retryBackoff(stack *terracev1.Stack, failures int64) time.Duration {
	base, limit := 30*time.Second, time.Hour
	if d := stack.Spec.RetryInterval; d != nil && d.Duration > 0 {
		base = d.Duration
	}
	if d := stack.Spec.MaxRetryInterval; d != nil && d.Duration > 0 {
		limit = d.Duration
	}
	exp := math.Min(float64(max(failures, 1)-1), 30)
	backoff := time.Duration(float64(base) * math.Pow(2, exp))
	if backoff > limit || backoff <= 0 {
		return limit
	}
	return backoff
}

// jitterFraction is the largest share of an interval added to it.
const jitterFraction = 0.1

// jitter lengthens d by up to jitterFraction, by an amount that is the
// Stack's own (a hash of its namespace, name and UID): Stacks created
// together spread their checks over the window instead of checking
// together forever, and one Stack's checks keep their rhythm. Flux's
// runtime/jitter does the same at random; its module would bring the
// Flux runtime and its Kubernetes versions for these few lines.
func jitter(stack *terracev1.Stack, d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(stack.Namespace + "/" + stack.Name + "/" + string(stack.UID)))
	share := float64(h.Sum64()%1000) / 1000
	return d + time.Duration(share*jitterFraction*float64(d))
}
