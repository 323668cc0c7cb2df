package stack

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Condition reasons about file mappings.
const (
	// FileMappingNotFoundReason: a spec.fileMappings Secret or key is missing.
	FileMappingNotFoundReason = "FileMappingNotFound"
	// FileMappingForbiddenReason: the runner's ServiceAccount may not get
	// the Secret, so Terrace does not read it for the Stack.
	FileMappingForbiddenReason = "FileMappingForbidden"
)

// runOptions are the Stack's run options as the runner takes them, and
// the policies its plans are checked against.
type runOptions struct {
	files    []*runnerv1.MappedFile
	policies *planPolicies
	// fileVersions are the mapped Secrets' versions, for the digest.
	fileVersions []string
}

// gatherRunOptions reads what spec.fileMappings and the config's plan
// policies name, and folds the run options, the mapped Secrets' versions
// and the policies' digest into the inputs digest: a change of any of them
// makes the pending plan stale and a new plan due.
func (r *Reconciler) gatherRunOptions(ctx context.Context, s *scope) error {
	versions, err := r.gatherFileMappings(ctx, s)
	if err != nil {
		return err
	}
	policies, err := r.loadPolicies(ctx, s)
	if err != nil {
		return err
	}
	s.options.policies, s.options.fileVersions = policies, versions
	s.inputs.digest = desiredDigest(s)
	return nil
}

// gatherDestroyOptions reads the file mappings a destroy needs (provider
// credentials) and the plan policies that decide the destroy's plan.
func (r *Reconciler) gatherDestroyOptions(ctx context.Context, s *scope) error {
	if _, err := r.gatherFileMappings(ctx, s); err != nil {
		return err
	}
	policies, err := r.loadPolicies(ctx, s)
	s.options.policies = policies
	return err
}

// gatherFileMappings reads every spec.fileMappings entry into s.options
// and returns the Secrets' versions.
func (r *Reconciler) gatherFileMappings(ctx context.Context, s *scope) ([]string, error) {
	s.options = &runOptions{}
	var versions []string
	for i, m := range s.stack.Spec.FileMappings {
		file, version, err := r.readFileMapping(ctx, s, i, m)
		if err != nil {
			return nil, err
		}
		s.options.files = append(s.options.files, file)
		versions = append(versions, fmt.Sprintf("%s/%s@%s", m.SecretRef.Name, m.SecretRef.Key, version))
	}
	return versions, nil
}

// readFileMapping reads one spec.fileMappings Secret key, uncached, when
// the Stack's runner ServiceAccount may read the Secret itself.
func (r *Reconciler) readFileMapping(ctx context.Context, s *scope, i int, m terracev1.FileMapping) (*runnerv1.MappedFile, string, error) {
	ns, sa := s.stack.Namespace, runnerServiceAccount(s)
	key := types.NamespacedName{Namespace: ns, Name: m.SecretRef.Name}
	allowed, err := r.serviceAccountMayGet(ctx, sa, "Secret", key)
	if err != nil {
		return nil, "", err
	}
	if !allowed {
		return nil, "", outcome.Terminalf(FileMappingForbiddenReason,
			"spec.fileMappings[%d]: ServiceAccount %s, which the Stack's runner runs as, may not get Secret %s/%s, so Terrace does not read it: grant it get on that Secret",
			i, sa, ns, m.SecretRef.Name)
	}
	var sec corev1.Secret
	if err := r.APIReader.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", outcome.Terminalf(FileMappingNotFoundReason, "spec.fileMappings[%d]: Secret %s/%s not found: create it", i, ns, m.SecretRef.Name)
		}
		return nil, "", fmt.Errorf("failed to read spec.fileMappings[%d] Secret %s: %w", i, m.SecretRef.Name, err)
	}
	content, ok := sec.Data[m.SecretRef.Key]
	if !ok {
		return nil, "", outcome.Terminalf(FileMappingNotFoundReason, "spec.fileMappings[%d]: Secret %s/%s has no key %q: add it or name another key", i, ns, m.SecretRef.Name, m.SecretRef.Key)
	}
	loc := runnerv1.FileLocation_FILE_LOCATION_MODULE
	if m.Location == terracev1.FileMappingHome {
		loc = runnerv1.FileLocation_FILE_LOCATION_HOME
	}
	return &runnerv1.MappedFile{Location: loc, Path: m.Path, Content: content}, sec.ResourceVersion, nil
}

// applyPlanOptions puts the Stack's run options into a plan request.
func applyPlanOptions(s *scope, req *runnerv1.PlanRequest) {
	spec := &s.stack.Spec
	req.Targets = spec.Targets
	req.Replace = spec.Replace
	req.SkipRefresh = spec.Refresh != nil && !*spec.Refresh
	if spec.Parallelism != nil {
		req.Parallelism = *spec.Parallelism
	}
	if req.Variables != nil {
		req.Variables.Files = spec.VarsFiles
	}
}

// applyRequest is the apply of a saved plan with the Stack's parallelism.
func applyRequest(s *scope, planID string) *runnerv1.ApplyRequest {
	req := &runnerv1.ApplyRequest{PlanId: planID}
	if p := s.stack.Spec.Parallelism; p != nil {
		req.Parallelism = *p
	}
	return req
}

// mappedFiles are the files Init writes, none before gatherRunOptions ran.
func (s *scope) mappedFiles() []*runnerv1.MappedFile {
	if s.options == nil {
		return nil
	}
	return s.options.files
}
