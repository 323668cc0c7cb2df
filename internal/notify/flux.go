// Package notify tells people outside the cluster what Stacks do: every
// Stack event to a Flux notification-controller in Flux's event format
// (FluxRecorder, --events-address), and notifications to Slack, Microsoft
// Teams and webhooks configured in the operator's namespace (Notifier,
// argoproj/notifications-engine, as Argo CD and Argo Rollouts do it).
package notify

import (
	"context"
	"fmt"
	"maps"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	fluxevents "github.com/fluxcd/pkg/runtime/events"
)

// fluxQueueSize bounds the events waiting for the notification-controller;
// past it, events are dropped (and logged) rather than held in memory.
const fluxQueueSize = 256

// FluxRecorder records every event as a Kubernetes Event and also posts
// it, as github.com/fluxcd/pkg/apis/event's Event, to a Flux
// notification-controller, with Flux's own recorder
// (github.com/fluxcd/pkg/runtime/events: severity info for Normal, error
// for Warning; retries with backoff on connection errors and 5xx).
//
// Flux's controllers post from the reconcile itself; here the post runs on
// a queue of its own, in order, so that a notification-controller that is
// down (Flux's recorder retries for up to half a minute) never holds a
// Stack's reconcile or its run slot. The Kubernetes Event is recorded at
// once, as before.
type FluxRecorder struct {
	kube  events.EventRecorder
	flux  fluxevents.Recorder
	queue chan fluxEvent
	log   logr.Logger
}

var (
	_ events.EventRecorder          = (*FluxRecorder)(nil)
	_ events.AnnotatedEventRecorder = (*FluxRecorder)(nil)
)

type fluxEvent struct {
	object         runtime.Object
	meta           map[string]string
	eventType      string
	reason, action string
	message        string
}

// NewFluxRecorder returns a recorder that records events with kube and
// posts them to address (http://notification-controller.flux-system.svc/
// in a cluster with Flux) as reportingController. scheme resolves the
// objects' kinds. Run it (Start) for the posts to be sent.
func NewFluxRecorder(kube events.EventRecorder, scheme *runtime.Scheme, address, reportingController string, log logr.Logger) (*FluxRecorder, error) {
	if log.GetSink() == nil {
		// Flux's recorder asks the sink about its level: logr.Discard() has none.
		log = funcr.New(func(string, string) {}, funcr.Options{})
	}
	// Without a Kubernetes backend of its own, Flux's recorder only posts:
	// the Kubernetes Event is kube's.
	flux, err := fluxevents.NewRecorder(log, address, reportingController, fluxevents.WithScheme(scheme))
	if err != nil {
		return nil, fmt.Errorf("failed to set up the Flux event recorder for --events-address %q: %w", address, err)
	}
	return &FluxRecorder{kube: kube, flux: flux, queue: make(chan fluxEvent, fluxQueueSize), log: log}, nil
}

// Eventf records an event without metadata.
func (r *FluxRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.AnnotatedEventf(regarding, related, nil, eventtype, reason, action, note, args...)
}

// AnnotatedEventf records an event with metadata: the Kubernetes Event
// carries it as annotations, the Flux event as metadata.
func (r *FluxRecorder) AnnotatedEventf(regarding, related runtime.Object, annotations map[string]string, eventtype, reason, action, note string, args ...any) {
	if annotated, ok := r.kube.(events.AnnotatedEventRecorder); ok && len(annotations) > 0 {
		annotated.AnnotatedEventf(regarding, related, annotations, eventtype, reason, action, note, args...)
	} else {
		r.kube.Eventf(regarding, related, eventtype, reason, action, note, args...)
	}
	// The reconciler goes on changing the object: post a copy.
	e := fluxEvent{object: regarding.DeepCopyObject(), meta: maps.Clone(annotations), eventType: eventtype,
		reason: reason, action: action, message: fmt.Sprintf(note, args...)}
	select {
	case r.queue <- e:
	default:
		r.log.Error(nil, "dropped an event for the notification-controller: too many are waiting (is it reachable?)", "reason", reason)
	}
}

// Start posts the queued events, one at a time, until ctx ends.
func (r *FluxRecorder) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-r.queue:
			r.flux.AnnotatedEventf(e.object, nil, e.meta, e.eventType, e.reason, e.action, "%s", e.message)
		}
	}
}

// NeedLeaderElection is false: whichever replica records events posts them.
func (r *FluxRecorder) NeedLeaderElection() bool { return false }
