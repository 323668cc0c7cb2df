package notify

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// fluxReceiver is a notification-controller's event endpoint: it decodes
// Flux's own Event type, and answers 500 to the first `fail` posts.
func fluxReceiver(t *testing.T, fail int) (*httptest.Server, <-chan eventv1.Event) {
	t.Helper()
	got := make(chan eventv1.Event, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s with Content-Type %q, want a JSON POST", req.Method, req.Header.Get("Content-Type"))
		}
		if fail > 0 {
			fail--
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		var e eventv1.Event
		if err := json.NewDecoder(req.Body).Decode(&e); err != nil {
			t.Errorf("not a Flux event: %v", err)
		}
		got <- e
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

func startFluxRecorder(t *testing.T, address string, kube events.EventRecorder) *FluxRecorder {
	t.Helper()
	r, err := NewFluxRecorder(kube, scheme.New(), address, "terrace-stack-controller", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = r.Start(ctx) }()
	return r
}

func receive(t *testing.T, got <-chan eventv1.Event) eventv1.Event {
	t.Helper()
	select {
	case e := <-got:
		return e
	case <-time.After(20 * time.Second):
		t.Fatal("no event reached the receiver")
		return eventv1.Event{}
	}
}

// TestFluxRecorderPostsFluxEvents: a Stack event reaches the
// notification-controller as Flux's Event, Normal as info and Warning as
// error, with the involved Stack, the reason and the metadata; and the
// Kubernetes Event is recorded as well, with the metadata as annotations.
func TestFluxRecorderPostsFluxEvents(t *testing.T) {
	srv, got := fluxReceiver(t, 0)
	kube := events.NewFakeRecorder(10)
	kube.Verbose = true
	r := startFluxRecorder(t, srv.URL, kube)

	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", UID: "u-1"}}
	meta := map[string]string{"terrace.dev/revision": "main@sha1:0123", "terrace.dev/plan": "plan-7", "terrace.dev/summary": "+1 ~0 -0", "terrace.dev/token": "plan-7"}
	r.AnnotatedEventf(stack, nil, meta, "Normal", "Applied", "Applied", "applied %s", "plan-7")
	stack.Name = "changed-after-recording" // the post must not see it
	e := receive(t, got)
	if e.InvolvedObject.Kind != "Stack" || e.InvolvedObject.APIVersion != "terrace.dev/v1alpha1" || e.InvolvedObject.Name != "web" || e.InvolvedObject.Namespace != "team" {
		t.Errorf("involved object %+v, want Stack team/web of terrace.dev/v1alpha1", e.InvolvedObject)
	}
	if e.Severity != eventv1.EventSeverityInfo || e.Reason != "Applied" || e.Message != "applied plan-7" || e.ReportingController != "terrace-stack-controller" {
		t.Errorf("event %s %s %q from %s, want info Applied \"applied plan-7\" from terrace-stack-controller", e.Severity, e.Reason, e.Message, e.ReportingController)
	}
	for k, v := range meta {
		if e.Metadata[k] != v {
			t.Errorf("metadata %s = %q, want %q (all: %v)", k, e.Metadata[k], v, e.Metadata)
		}
	}
	// What the notification-controller reads as the revision.
	if rev := e.Metadata[e.InvolvedObject.GroupVersionKind().Group+"/"+eventv1.MetaRevisionKey]; rev != "main@sha1:0123" {
		t.Errorf("revision under the Stack's group = %q", rev)
	}
	select {
	case k := <-kube.Events:
		if want := "Normal Applied Applied applied plan-7"; len(k) < len(want) || k[:len(want)] != want {
			t.Errorf("Kubernetes event %q, want it to start with %q", k, want)
		}
	default:
		t.Error("no Kubernetes event recorded")
	}

	r.Eventf(stack, nil, "Warning", "ReconciliationFailed", "ReconciliationFailed", "failed to plan: %s", "Error: boom")
	if e := receive(t, got); e.Severity != eventv1.EventSeverityError || e.Reason != "ReconciliationFailed" || e.Message != "failed to plan: Error: boom" {
		t.Errorf("warning posted as %s %s %q, want error ReconciliationFailed", e.Severity, e.Reason, e.Message)
	}
}

// TestFluxRecorderRetries: a notification-controller answering 5xx gets the
// event again, as Flux's recorder does.
func TestFluxRecorderRetries(t *testing.T) {
	srv, got := fluxReceiver(t, 1)
	r := startFluxRecorder(t, srv.URL, events.NewFakeRecorder(10))
	r.Eventf(&terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team"}}, nil, "Normal", "Ready", "Ready", "ready")
	if e := receive(t, got); e.Reason != "Ready" {
		t.Errorf("got %s after a retry, want Ready", e.Reason)
	}
}

// TestFluxRecorderDoesNotHoldTheCaller: with the notification-controller
// unreachable, recording returns at once and the Kubernetes Event is kept.
func TestFluxRecorderDoesNotHoldTheCaller(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	address := srv.URL
	srv.Close() // nothing listens there now
	kube := events.NewFakeRecorder(fluxQueueSize + 10)
	r := startFluxRecorder(t, address, kube)
	start := time.Now()
	for range fluxQueueSize + 5 {
		r.Eventf(&terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team"}}, nil, "Normal", "Ready", "Ready", "ready")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("recording took %s with the receiver down", d)
	}
	if n := len(kube.Events); n != fluxQueueSize+5 {
		t.Errorf("%d Kubernetes events, want %d", n, fluxQueueSize+5)
	}
}
