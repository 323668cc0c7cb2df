package stack

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
)

// Condition reasons about sources.
const (
	SourceNotReadyReason        = "SourceNotReady"
	SourceNotFoundReason        = "SourceNotFound"
	InvalidProgramReason        = terracev1.InvalidProgramReason
	CrossNamespaceRefusedReason = "CrossNamespaceRefRefused"
)

// sourceWait is how long a Stack waits before looking at a source that is
// not ready; the watches of Programs and of installed Flux kinds usually
// wake it sooner.
const sourceWait = 30 * time.Second

// fluxAPIVersions are the versions of Flux's source kinds read when a
// sourceRef names none.
var fluxAPIVersions = map[string]string{
	"GitRepository": "source.toolkit.fluxcd.io/v1",
	"OCIRepository": "source.toolkit.fluxcd.io/v1",
	"Bucket":        "source.toolkit.fluxcd.io/v1",
}

// source is a resolved module tarball.
type source struct {
	// description names the source for messages: "Program team-a/net".
	description string
	url         string
	digest      string
	// revision identifies the content for status: the Program or Flux
	// artifact revision, or the digest of a URL.
	revision string
	// fromArtifactServer is true for Programs: the runner fetches them
	// itself over mutual TLS; other tarballs are downloaded by the
	// controller and uploaded to the runner.
	fromArtifactServer bool
}

// resolveSource finds the tarball a Stack deploys.
func (r *Reconciler) resolveSource(ctx context.Context, s *scope) error {
	src := s.stack.Spec.Source
	switch {
	case src.ProgramRef != nil:
		return r.resolveProgram(ctx, s, src.ProgramRef.Name)
	case src.SourceRef != nil:
		return r.resolveFluxSource(ctx, s, src.SourceRef)
	default:
		s.source = &source{description: "URL " + src.URL, url: src.URL, digest: src.Digest, revision: src.Digest}
		return nil
	}
}

func (r *Reconciler) resolveProgram(ctx context.Context, s *scope, name string) error {
	key := types.NamespacedName{Namespace: s.stack.Namespace, Name: name}
	var prog terracev1.Program
	if err := r.Client.Get(ctx, key, &prog); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Waiting(SourceNotFoundReason, sourceWait, fmt.Errorf("Program %s not found: create it or fix spec.source.programRef", key))
		}
		return fmt.Errorf("failed to get Program %s: %w", key, err)
	}
	ready := reconcile.Get(&prog, terracev1.ReadyCondition)
	if ready != nil && ready.ObservedGeneration == prog.Generation && ready.Reason == terracev1.InvalidProgramReason {
		return reconcile.Terminalf(InvalidProgramReason, "Program %s is invalid: %s", key, ready.Message)
	}
	a := prog.Status.Artifact
	if a == nil || ready == nil || ready.Status != "True" || ready.ObservedGeneration != prog.Generation {
		return reconcile.Waiting(SourceNotReadyReason, sourceWait, fmt.Errorf("Program %s has no artifact for generation %d yet", key, prog.Generation))
	}
	s.source = &source{description: "Program " + key.String(), url: a.URL, digest: a.Digest, revision: a.Revision, fromArtifactServer: true}
	return nil
}

func (r *Reconciler) resolveFluxSource(ctx context.Context, s *scope, ref *terracev1.SourceReference) error {
	ns := ref.Namespace
	if ns == "" {
		ns = s.stack.Namespace
	}
	if ns != s.stack.Namespace && !r.Options.AllowCrossNamespaceRefs {
		return reconcile.Terminalf(CrossNamespaceRefusedReason, "%s %s/%s is in another namespace; the controller refuses cross-namespace references (--allow-cross-namespace-refs)", ref.Kind, ns, ref.Name)
	}
	apiVersion := ref.APIVersion
	if apiVersion == "" {
		apiVersion = fluxAPIVersions[ref.Kind]
	}
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(apiVersion)
	obj.SetKind(ref.Kind)
	r.sources.ensure(ctx, obj.GroupVersionKind())
	key := types.NamespacedName{Namespace: ns, Name: ref.Name}
	desc := fmt.Sprintf("%s %s", ref.Kind, key)
	if err := r.APIReader.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return reconcile.Waiting(SourceNotFoundReason, sourceWait, fmt.Errorf("%s not found: %v", desc, err))
		}
		return fmt.Errorf("failed to get %s: %w", desc, err)
	}
	url, _, _ := unstructured.NestedString(obj.Object, "status", "artifact", "url")
	digest, _, _ := unstructured.NestedString(obj.Object, "status", "artifact", "digest")
	revision, _, _ := unstructured.NestedString(obj.Object, "status", "artifact", "revision")
	if url == "" || digest == "" {
		return reconcile.Waiting(SourceNotReadyReason, sourceWait, fmt.Errorf("%s has no artifact yet", desc))
	}
	if revision == "" {
		revision = digest
	}
	s.source = &source{description: desc, url: url, digest: digest, revision: revision}
	return nil
}
