package notify

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// stackRequests counts the requests a config's clients make for Stacks
// and the watches of Stacks they hold open.
type stackRequests struct {
	all, openWatches atomic.Int64
}

// countingTransport is one client's transport, counting into counts.
type countingTransport struct {
	next   http.RoundTripper
	counts *stackRequests
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.Contains(req.URL.Path, "/stacks") {
		return c.next.RoundTrip(req)
	}
	c.counts.all.Add(1)
	resp, err := c.next.RoundTrip(req)
	if err == nil && req.URL.Query().Get("watch") == "true" {
		c.counts.openWatches.Add(1)
		resp.Body = &countedBody{ReadCloser: resp.Body, open: &c.counts.openWatches}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	once sync.Once
	open *atomic.Int64
}

func (b *countedBody) Close() error {
	b.once.Do(func() { b.open.Add(-1) })
	return b.ReadCloser.Close()
}

// A cluster without the notifications ConfigMap pays nothing for the
// notification controller: it neither lists nor watches Stacks (whose
// unstructured copies would double the controller's Stack memory). Once
// the ConfigMap exists it notifies a subscribed Stack; once it is deleted
// the Stack watch ends.
func TestNotifierWatchesStacksOnlyWhileItsConfigMapExists(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.Namespace(t)
	received := make(chan string, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		received <- string(body)
	}))
	defer receiver.Close()

	st := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "notified", Namespace: ns, Annotations: map[string]string{
			AnnotationPrefix + "/subscribe.on-applied.receiver": "",
		}},
		Spec: terracev1.StackSpec{Source: terracev1.StackSource{URL: receiver.URL + "/module.tar.gz", Digest: "sha256:" + strings.Repeat("0", 64)}},
	}
	if err := env.Client.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	st.Status = terracev1.StackStatus{
		Conditions: []metav1.Condition{{Type: terracev1.AppliedCondition, Status: metav1.ConditionTrue, Reason: "Applied", Message: "applied release 1", LastTransitionTime: metav1.Now()}},
		Release:    &terracev1.ReleaseStatus{Revision: 1},
	}
	if err := env.Client.Status().Update(ctx, st); err != nil {
		t.Fatal(err)
	}

	requests := &stackRequests{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, counts: requests} })
	waiting := make(chan struct{})
	var once sync.Once
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "not watching Stacks until the notifications ConfigMap exists") {
			once.Do(func() { close(waiting) })
		}
	}, funcr.Options{})
	notifier := NewNotifier(cfg, NotifierOptions{Namespace: ns, StackNamespaces: []string{ns}, Log: log})
	stopped := make(chan error, 1)
	go func() { stopped <- notifier.Start(ctx) }()

	select {
	case <-waiting:
	case err := <-stopped:
		t.Fatalf("the notifier stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the notifier never said it waits for its ConfigMap")
	}
	time.Sleep(time.Second) // nothing may follow while the ConfigMap is missing
	if n := requests.all.Load(); n != 0 {
		t.Fatalf("%d requests for Stacks without a notifications ConfigMap, want none", n)
	}

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigMapName, Namespace: ns},
		Data:       map[string]string{"service.webhook.receiver": "url: " + receiver.URL + "/hook\n"},
	}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	select {
	case body := <-received:
		if !strings.Contains(body, `"event": "applied"`) && !strings.Contains(body, `"event":"applied"`) {
			t.Errorf("notification %s, want the applied event", body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no notification within 30 s of the ConfigMap's creation")
	}
	if requests.openWatches.Load() == 0 {
		t.Error("no watch of Stacks while notifications are configured")
	}

	if err := env.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for requests.openWatches.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d watches of Stacks still open 30 s after the ConfigMap's deletion", requests.openWatches.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the notifier did not stop within 30 s of its context's end")
	}
}
