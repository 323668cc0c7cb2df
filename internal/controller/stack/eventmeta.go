package stack

import (
	"fmt"

	"k8s.io/client-go/tools/events"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Event metadata: what an event about a change says beyond its message,
// for whoever acts on events rather than reads them. Kubernetes keeps it as
// the Event's annotations; Flux's notification-controller (--events-address)
// receives it as the Flux event's metadata, keeps only keys prefixed with
// the involved object's API group (as Flux's own controllers write
// "kustomize.toolkit.fluxcd.io/revision"), and tells duplicates apart by
// <group>/revision and <group>/token.
const (
	// EventRevisionKey is the source revision the event is about
	// (main@sha1:<hex>, a Program's or Flux artifact's revision, a URL's
	// digest).
	EventRevisionKey = "terrace.dev/revision"
	// EventPlanKey is the id of the plan the event is about.
	EventPlanKey = "terrace.dev/plan"
	// EventSummaryKey is that plan's summary, "+add ~change -destroy".
	EventSummaryKey = "terrace.dev/summary"
	// EventTokenKey makes events of two plans of one revision distinct
	// for Flux's duplicate filter: the plan id.
	EventTokenKey = "terrace.dev/token"
)

// planRef names a plan in an event's metadata: one made in this reconcile
// (planObservation) or one being applied (planRecord).
type planRef struct {
	id      string
	summary *runnerv1.PlanSummary
}

func (p *planObservation) ref() *planRef {
	if p == nil {
		return nil
	}
	return &planRef{id: p.id, summary: p.summary}
}

func (p planRecord) ref() *planRef { return &planRef{id: p.id, summary: p.summary} }

// eventMetadata is the metadata of an event about s and, when not nil, the
// plan p.
func eventMetadata(s *scope, p *planRef) map[string]string {
	meta := map[string]string{}
	if rev := eventRevision(s); rev != "" {
		meta[EventRevisionKey] = rev
	}
	if p != nil && p.id != "" {
		meta[EventPlanKey] = p.id
		meta[EventSummaryKey] = summaryText(p.summary)
		meta[EventTokenKey] = p.id
	}
	return meta
}

// eventRevision is the revision this reconcile works on: the resolved
// source's, else the one last attempted, else the one last applied.
func eventRevision(s *scope) string {
	if s.source != nil && s.source.revision != "" {
		return s.source.revision
	}
	if st := s.stack.Status; st.LastAttemptedRevision != "" {
		return st.LastAttemptedRevision
	}
	return s.stack.Status.LastAppliedRevision
}

// normalEventFor records a Normal event on s's Stack with the revision and,
// when p is not nil, the plan as metadata.
func (r *Reconciler) normalEventFor(s *scope, p *planRef, reason, format string, args ...any) {
	r.annotatedEvent(s.stack, eventMetadata(s, p), "Normal", reason, format, args...)
}

// warningEventFor is normalEventFor for a Warning event.
func (r *Reconciler) warningEventFor(s *scope, p *planRef, reason, format string, args ...any) {
	r.annotatedEvent(s.stack, eventMetadata(s, p), "Warning", reason, format, args...)
}

// annotatedEvent records the event with its metadata where the recorder
// takes metadata (controller-runtime's does, and so does
// notify.FluxRecorder), else without.
func (r *Reconciler) annotatedEvent(stack *terracev1.Stack, meta map[string]string, eventType, reason, format string, args ...any) {
	if r.Recorder == nil {
		return
	}
	note := fmt.Sprintf(format, args...)
	if annotated, ok := r.Recorder.(events.AnnotatedEventRecorder); ok && len(meta) > 0 {
		annotated.AnnotatedEventf(stack, nil, meta, eventType, reason, reason, "%s", note)
		return
	}
	r.Recorder.Eventf(stack, nil, eventType, reason, reason, "%s", note)
}
