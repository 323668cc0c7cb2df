// Package program reconciles Programs: it validates their files and
// advertises the tarball the artifact server builds for each valid
// generation in status.artifact.
package program

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// ControllerName names the controller in logs, metrics and events.
const ControllerName = "terrace-program-controller"

// Event reasons.
const (
	// NewArtifactReason: a new generation's artifact is advertised.
	NewArtifactReason = "NewArtifact"
	// RecoveredReason: the Program was not Ready and is again.
	RecoveredReason = "Recovered"
)

// Options configure the Program controller.
type Options struct {
	// ArtifactBaseURL is the artifact server's advertised base URL,
	// e.g. https://terrace-controller.terrace-system.svc:9443.
	ArtifactBaseURL string
	// MaxConcurrentReconciles defaults to 2.
	MaxConcurrentReconciles int
	// Selector picks the Programs this controller reconciles, by their
	// labels (a shard's --watch-label-selector); nil reconciles every one.
	// Every shard still reads every Program: a Stack of any shard may
	// name any Program of its namespace.
	Selector labels.Selector
}

// Reconciler validates Programs and advertises their artifacts.
type Reconciler struct {
	Client          client.Client
	Recorder        events.EventRecorder
	ArtifactBaseURL string
	// Selector: see Options.Selector.
	Selector labels.Selector
}

// +kubebuilder:rbac:groups=terrace.dev,resources=programs,verbs=get;list;watch
// +kubebuilder:rbac:groups=terrace.dev,resources=programs/status,verbs=patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the Program controller with mgr.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if opts.ArtifactBaseURL == "" {
		return errors.New("program controller: the artifact base URL is required")
	}
	if opts.MaxConcurrentReconciles <= 0 {
		opts.MaxConcurrentReconciles = 2
	}
	r := &Reconciler{
		Client:          mgr.GetClient(),
		Recorder:        mgr.GetEventRecorder(ControllerName),
		ArtifactBaseURL: opts.ArtifactBaseURL,
		Selector:        opts.Selector,
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("program").
		For(&terracev1.Program{}, builder.WithPredicates(outcome.GenerationOrRequestChanged(), outcome.LabelsMatch(opts.Selector))).
		WithOptions(controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles}).
		Complete(r)
}

// programScope is what the steps of one reconcile share and observe.
type programScope struct {
	program *terracev1.Program
	// previous is the status as read, to tell what changed.
	previous terracev1.ProgramStatus
	// invalid is set when the files failed validation; no artifact then.
	invalid bool
	// artifact is the artifact of the current generation, once built.
	artifact *terracev1.Artifact
}

type step func(ctx context.Context, s *programScope) error

// Reconcile validates the Program's current generation and advertises its
// artifact, or reports why it cannot.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	obj := &terracev1.Program{}
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !outcome.Owns(r.Selector, obj) {
		return ctrl.Result{}, nil // another shard's
	}
	if !obj.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // nothing is stored outside the object: nothing to clean up
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("program", klog.KObj(obj), "generation", obj.Generation))
	patcher := outcome.NewStatusPatcher(r.Client, obj)
	scope := &programScope{program: obj, previous: *obj.Status.DeepCopy()}

	var stepErr error
	defer func() {
		out := r.summarize(ctx, scope, stepErr)
		if err := patcher.Patch(ctx, obj, outcome.KstatusConditions...); err != nil && !apierrors.IsNotFound(err) {
			out.Err = errors.Join(out.Err, err)
		}
		result, retErr = out.Result, out.Err
	}()

	outcome.HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus)
	for _, s := range []step{r.validate, r.buildArtifact} {
		if stepErr = s(ctx, scope); stepErr != nil {
			return
		}
	}
	return
}

// validate parses every configuration file of the Program.
func (r *Reconciler) validate(_ context.Context, s *programScope) error {
	if err := validateFiles(s.program.Spec.Files); err != nil {
		s.invalid = true
		return outcome.Terminal(terracev1.InvalidProgramReason, err)
	}
	return nil
}

// buildArtifact builds the tarball to learn its digest and size; the bytes
// are served by the artifact server, which rebuilds them identically.
func (r *Reconciler) buildArtifact(_ context.Context, s *programScope) error {
	p := s.program
	data, digest, err := artifactserver.BuildProgram(p)
	if err != nil {
		s.invalid = true
		return outcome.Terminal(terracev1.InvalidProgramReason, err)
	}
	size := int64(len(data))
	s.artifact = &terracev1.Artifact{
		URL:            artifactserver.ProgramURL(r.ArtifactBaseURL, p.Namespace, p.Name, p.Generation),
		Revision:       artifactserver.ProgramRevision(p.Generation, digest),
		Digest:         digest,
		Size:           &size,
		LastUpdateTime: metav1.Now(),
	}
	if prev := s.previous.Artifact; prev != nil && prev.URL == s.artifact.URL && prev.Revision == s.artifact.Revision {
		s.artifact.LastUpdateTime = prev.LastUpdateTime
	}
	return nil
}

// summarize derives the status from what the steps observed and emits the
// events for what changed.
func (r *Reconciler) summarize(ctx context.Context, s *programScope, stepErr error) outcome.Outcome {
	p := s.program
	switch {
	case s.invalid:
		p.Status.Artifact = nil
	case s.artifact != nil:
		p.Status.Artifact = s.artifact
	}
	readyMessage := ""
	if s.artifact != nil {
		readyMessage = fmt.Sprintf("serving artifact for revision %s", stackview.ShortRevision(s.artifact.Revision))
	}
	out := outcome.Summarize(p, stepErr, terracev1.ArtifactReadyReason, readyMessage, 0)
	if out.Final {
		p.Status.ObservedGeneration = p.Generation
	}

	logger := log.FromContext(ctx)
	if stepErr != nil {
		logger.Info("program not ready", "reason", outcome.Get(p, terracev1.ReadyCondition).Reason, "error", stepErr.Error())
		return out
	}
	wasReady := conditionStatus(s.previous.Conditions, terracev1.ReadyCondition)
	newRevision := s.previous.Artifact == nil || s.previous.Artifact.Revision != s.artifact.Revision || s.previous.Artifact.URL != s.artifact.URL
	switch {
	case wasReady == metav1.ConditionFalse:
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, RecoveredReason, "Validate", "program is valid again; serving artifact for revision %s", s.artifact.Revision)
		logger.Info("program recovered", "revision", s.artifact.Revision)
	case newRevision:
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, NewArtifactReason, "Build", "serving artifact for revision %s", s.artifact.Revision)
		logger.Info("new artifact", "revision", s.artifact.Revision, "size", *s.artifact.Size)
	}
	return out
}

func conditionStatus(conds []metav1.Condition, t string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}
