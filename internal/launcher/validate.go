package launcher

// What a run spec must be before any pod is built from it.

import (
	"fmt"
	"strings"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// validateRunSpec refuses what can never make a valid pod; the error wraps ErrInvalidSpec.
func validateRunSpec(spec *RunSpec) error {
	if spec.Stack == nil || spec.Stack.Name == "" || spec.Stack.Namespace == "" || spec.Stack.UID == "" {
		return fmt.Errorf("%w: the Stack's name, namespace and UID are required", ErrInvalidSpec)
	}
	if len(spec.RunID) > maxRunIDLength || !runIDPattern.MatchString(spec.RunID) {
		return fmt.Errorf("%w: run ID %q must be 1-%d lowercase letters, digits and '-', starting and ending with a letter or digit", ErrInvalidSpec, spec.RunID, maxRunIDLength)
	}
	switch spec.Binary {
	case "", terracev1.BinaryTofu, terracev1.BinaryTerraform:
	default:
		return fmt.Errorf("%w: binary %q is neither tofu nor terraform", ErrInvalidSpec, spec.Binary)
	}
	if t := spec.Stack.Spec.Runner; t != nil {
		for _, v := range t.Volumes {
			if v.Name == tlsVolume || v.Name == workVolume || v.Name == tmpVolume || v.Name == gitVolume || v.Name == forgeVolume {
				return fmt.Errorf("%w: spec.runner.volumes: the name %q is reserved for the runner", ErrInvalidSpec, v.Name)
			}
		}
		for _, m := range t.VolumeMounts {
			for _, own := range []string{tlsMountPath, workMountPath, tmpMountPath, GitCredentialsPath, ForgeCredentialsPath} {
				if pathWithin(m.MountPath, own) || pathWithin(own, m.MountPath) {
					return fmt.Errorf("%w: spec.runner.volumeMounts: %q overlaps %s, which the runner uses", ErrInvalidSpec, m.MountPath, own)
				}
			}
		}
	}
	return nil
}

// checkPolicy refuses a pod the runner policy does not allow; the error
// wraps ErrPolicyViolation and runnerpolicy.Violations.
func checkPolicy(spec *RunSpec, image string) error {
	policy := runnerpolicy.Minimal()
	if spec.Policy != nil {
		policy = *spec.Policy
	}
	sa := spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	pod := runnerpolicy.Pod{
		Template: spec.Stack.Spec.Runner,
		Image:    image, ImageField: orField(spec.ImageField, "spec.runner.image"),
		ServiceAccountName: sa, ServiceAccountField: orField(spec.ServiceAccountField, "spec.serviceAccountName"),
	}
	if b := spec.Stack.Spec.Backend; b != nil {
		pod.OwnBackend = b.Type
	}
	if err := policy.Check(pod); err != nil {
		return fmt.Errorf("%w: %w", ErrPolicyViolation, err)
	}
	return nil
}

func orField(field, fallback string) string {
	if field == "" {
		return fallback
	}
	return field
}

// pathWithin reports whether p is dir or below it.
func pathWithin(p, dir string) bool {
	p, dir = strings.TrimRight(p, "/"), strings.TrimRight(dir, "/")
	return p == dir || strings.HasPrefix(p, dir+"/")
}
