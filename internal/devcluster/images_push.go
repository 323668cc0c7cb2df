package devcluster

import "context"

// PushBinaryImage pushes an image of one static binary, run as user 65532
// with args after it, to the dev registry at registryHost (what `terrace
// dev` prints after "registry:"), under the path and tag of ref: a pod of
// the dev cluster naming ref, whatever its registry, runs that binary.
func PushBinaryImage(ctx context.Context, registryHost, ref, binary string, args ...string) error {
	return (&Registry{Host: registryHost}).pushBinaryImage(ctx, ref, binary, args...)
}
