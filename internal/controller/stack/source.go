package stack

import (
	"context"
	"fmt"
	"net/url"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/readiness"
)

// Condition reasons about sources.
const (
	SourceNotReadyReason        = "SourceNotReady"
	SourceNotFoundReason        = "SourceNotFound"
	InvalidProgramReason        = terracev1.InvalidProgramReason
	CrossNamespaceRefusedReason = "CrossNamespaceRefRefused"
	// SourceHostNotAllowedReason: a Flux artifact on a host off
	// --source-artifact-hosts; nothing was fetched.
	SourceHostNotAllowedReason = "SourceHostNotAllowed"
	// SourceDigestMismatchReason: the tarball is not the one its digest names.
	SourceDigestMismatchReason = "SourceDigestMismatch"
	// SourceUnsafeReason: the archive has entries that could escape its
	// directory (absolute paths, "..", links out, devices).
	SourceUnsafeReason = "SourceUnsafe"
	// SourceTooLargeReason: the archive is over a size or entry limit.
	SourceTooLargeReason = "SourceTooLarge"
	// SourceInvalidReason: the runner refused the source request itself
	// (a URL that is not http(s), a malformed digest).
	SourceInvalidReason = "SourceInvalid"
	// SourceUnavailableReason: the server answered an HTTP error or could
	// not be reached.
	SourceUnavailableReason = "SourceUnavailable"
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
	// url is where a URL source or a Flux artifact is downloaded from.
	url    string
	digest string
	// revision identifies the content for status: the Program or Flux
	// artifact revision, or the digest of a URL.
	revision string
	// origin says who downloads the tarball, from where.
	origin sourceOrigin
	// data is a Program's tarball (fromProgram), uploaded to the runner.
	data []byte
	// git is what the runner clones (fromGit).
	git *gitClone
}

// sourceOrigin says where a tarball comes from, and so who downloads it.
type sourceOrigin int

const (
	// fromProgram: a Program; the controller builds its tarball, as its
	// artifact server does, and uploads it over the run's connection.
	// (The zero value is no origin: a source always names one.)
	fromProgram sourceOrigin = iota + 1
	// fromStackURL: spec.source.url; the runner fetches it from its pod's
	// network position, never the controller from its own.
	fromStackURL
	// fromFluxArtifact: a Flux source's artifact; the controller
	// downloads it from an allowed host (source-controller) and uploads it.
	fromFluxArtifact
	// fromGit: spec.source.git; the runner clones it from its pod's
	// network position, with the credentials mounted there; the
	// controller never connects to it (git.go).
	fromGit
)

// resolveSource finds the tarball a Stack deploys.
func (r *Reconciler) resolveSource(ctx context.Context, s *scope) error {
	src := s.stack.Spec.Source
	switch {
	case src.ProgramRef != nil:
		return r.resolveProgram(ctx, s, src.ProgramRef.Name)
	case src.SourceRef != nil:
		return r.resolveFluxSource(ctx, s, src.SourceRef)
	case src.Git != nil:
		s.source = resolveGitSource(s.stack)
		return nil
	default:
		s.source = &source{description: "URL " + describeURL(src.URL), url: src.URL, digest: src.Digest, revision: src.Digest, origin: fromStackURL}
		return nil
	}
}

func (r *Reconciler) resolveProgram(ctx context.Context, s *scope, name string) error {
	key := types.NamespacedName{Namespace: s.stack.Namespace, Name: name}
	var prog terracev1.Program
	if err := r.Client.Get(ctx, key, &prog); err != nil {
		if apierrors.IsNotFound(err) {
			return outcome.Waiting(SourceNotFoundReason, sourceWait, fmt.Errorf("Program %s not found: create it or fix spec.source.programRef", key))
		}
		return fmt.Errorf("failed to get Program %s: %w", key, err)
	}
	ready := outcome.Get(&prog, terracev1.ReadyCondition)
	if ready != nil && ready.ObservedGeneration == prog.Generation && ready.Reason == terracev1.InvalidProgramReason {
		return outcome.Terminalf(InvalidProgramReason, "Program %s is invalid: %s", key, ready.Message)
	}
	ok, _, err := readiness.ReadyAtGeneration(&prog)
	if err != nil {
		return fmt.Errorf("failed to read the readiness of Program %s: %w", key, err)
	}
	a := prog.Status.Artifact
	if a == nil || !ok {
		return outcome.Waiting(SourceNotReadyReason, sourceWait, fmt.Errorf("Program %s has no artifact for generation %d yet", key, prog.Generation))
	}
	// The tarball is built here (from the artifact server's cache), before
	// any run starts: a status.artifact another controller version wrote
	// for other bytes waits for the Program controller to write it again.
	data, digest, err := r.Programs.Artifact(&prog)
	if err != nil {
		return err
	}
	if digest != a.Digest {
		return outcome.Waiting(SourceNotReadyReason, sourceWait, fmt.Errorf("Program %s generation %d builds to %s, its status.artifact says %s; waiting for the Program's status to catch up", key, prog.Generation, digest, a.Digest))
	}
	s.source = &source{description: "Program " + key.String(), digest: a.Digest, revision: a.Revision, origin: fromProgram, data: data}
	return nil
}

func (r *Reconciler) resolveFluxSource(ctx context.Context, s *scope, ref *terracev1.SourceReference) error {
	ns := ref.Namespace
	if ns == "" {
		ns = s.stack.Namespace
	}
	if ns != s.stack.Namespace && !r.Options.AllowCrossNamespaceRefs {
		return outcome.Terminalf(CrossNamespaceRefusedReason, "%s %s/%s is in another namespace; the controller refuses cross-namespace references (--allow-cross-namespace-refs)", ref.Kind, ns, ref.Name)
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
			return outcome.Waiting(SourceNotFoundReason, sourceWait, fmt.Errorf("%s not found: %v", desc, err))
		}
		return fmt.Errorf("failed to get %s: %w", desc, err)
	}
	url, _, _ := unstructured.NestedString(obj.Object, "status", "artifact", "url")
	digest, _, _ := unstructured.NestedString(obj.Object, "status", "artifact", "digest")
	revision, _, _ := unstructured.NestedString(obj.Object, "status", "artifact", "revision")
	if url == "" || digest == "" {
		return outcome.Waiting(SourceNotReadyReason, sourceWait, fmt.Errorf("%s has no artifact yet", desc))
	}
	if revision == "" {
		revision = digest
	}
	if err := r.checkArtifactHost(desc, url); err != nil {
		return err
	}
	s.source = &source{description: desc, url: url, digest: digest, revision: revision, origin: fromFluxArtifact}
	return nil
}

// checkArtifactHost refuses, before any connection, a Flux artifact URL
// whose host the operator did not allow: whoever may write a Flux
// source's status must not make the controller read its own network.
func (r *Reconciler) checkArtifactHost(desc, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return outcome.Terminalf(SourceHostNotAllowedReason, "%s advertises an artifact URL without an http(s) host; only artifacts on the hosts of the controller flag --source-artifact-hosts (%s) are fetched", desc, r.Options.SourceArtifactHosts)
	}
	if !r.Options.SourceArtifactHosts.Allows(u) {
		return outcome.Terminalf(SourceHostNotAllowedReason, "%s advertises an artifact on host %s, which is not an allowed source host (%s); the operator may add it with the controller flag --source-artifact-hosts", desc, u.Host, r.Options.SourceArtifactHosts)
	}
	return nil
}

// describeURL names a URL in messages without its credentials or query,
// which may hold tokens.
func describeURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return rawURL
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
