package notify

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/argoproj/notifications-engine/pkg/api"
	"github.com/argoproj/notifications-engine/pkg/services"
	"github.com/argoproj/notifications-engine/pkg/subscriptions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// engineAPI is the notifications API as the Notifier builds it from the
// ConfigMap data and Secret data given.
func engineAPI(t *testing.T, cmData map[string]string, secretData map[string][]byte) api.API {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigMapName, Namespace: "terrace-system"}, Data: cmData}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DefaultSecretName, Namespace: "terrace-system"}, Data: secretData}
	cfg, err := api.ParseConfig(cm, secret)
	if err != nil {
		t.Fatal(err)
	}
	addDefaults(cfg, cm)
	a, err := api.NewAPI(*cfg, func(obj map[string]any, _ services.Destination) map[string]any { return stackVars(obj) })
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func cond(t, status, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg}
}

func toObj(t *testing.T, s *terracev1.Stack) map[string]any {
	t.Helper()
	s.APIVersion, s.Kind = terracev1.GroupVersion.String(), "Stack"
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func stackWith(mutate func(*terracev1.Stack)) *terracev1.Stack {
	s := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}
	mutate(s)
	return s
}

var (
	awaiting = stackWith(func(s *terracev1.Stack) {
		s.Status.LastAttemptedRevision = "main@sha1:0123"
		s.Status.Plan = &terracev1.PlanStatus{ID: "plan-4-abc", Pending: "plan-4-abc", Add: 2, Change: 1}
		s.Status.Conditions = []metav1.Condition{cond("Ready", "False", "AwaitingApproval", "plan plan-4-abc awaits approval"), cond("Reconciling", "True", "AwaitingApproval", "")}
	})
	applied = stackWith(func(s *terracev1.Stack) {
		s.Status.LastAttemptedRevision, s.Status.LastAppliedRevision = "main@sha1:0123", "main@sha1:0123"
		s.Status.Plan = &terracev1.PlanStatus{ID: "plan-4-abc", Add: 2, Change: 1}
		s.Status.Release = &terracev1.ReleaseStatus{Revision: 3, Status: "deployed"}
		s.Status.Conditions = []metav1.Condition{cond("Ready", "True", "Applied", "applied main@sha1:0123 (release 3)"), cond("Applied", "True", "Applied", "applied main@sha1:0123")}
	})
	failing = stackWith(func(s *terracev1.Stack) {
		s.Status.LastAttemptedRevision = "main@sha1:0456"
		s.Status.Failures = 2
		s.Status.Conditions = []metav1.Condition{cond("Ready", "False", "PlanFailed", "Error: Invalid reference"), cond("Applied", "True", "Applied", "applied main@sha1:0123")}
	})
	stalled = stackWith(func(s *terracev1.Stack) {
		s.Status.Conditions = []metav1.Condition{cond("Ready", "False", "InvalidProgram", "main.tf:3:1: bad"), cond("Stalled", "True", "InvalidProgram", "main.tf:3:1: bad")}
	})
	drifted = stackWith(func(s *terracev1.Stack) {
		at := metav1.Now()
		s.Status.LastAppliedRevision = "main@sha1:0123"
		s.Status.LastDriftDetectedAt = &at
		s.Status.Plan = &terracev1.PlanStatus{ID: "plan-5-drift", Change: 1, Drift: 1}
		s.Status.Conditions = []metav1.Condition{cond("Ready", "True", "NoChanges", "up to date"), cond("Drifted", "True", "DriftDetected", "resources changed outside Terrace: ~1")}
	})
)

// TestBuiltinTriggers: each built-in trigger fires on the Stack status it
// is named for and on no other.
func TestBuiltinTriggers(t *testing.T) {
	a := engineAPI(t, nil, nil)
	stacks := map[string]*terracev1.Stack{"awaiting": awaiting, "applied": applied, "failing": failing, "stalled": stalled, "drifted": drifted,
		"new": stackWith(func(*terracev1.Stack) {})}
	want := map[string][]string{
		"on-plan-pending": {"awaiting"},
		"on-applied":      {"applied"},
		"on-failed":       {"failing", "stalled"},
		"on-drift":        {"drifted"},
	}
	for trigger, fires := range want {
		for name, s := range stacks {
			res, err := a.RunTrigger(trigger, toObj(t, s))
			if err != nil || len(res) != 1 {
				t.Fatalf("%s on %s: %v %v", trigger, name, res, err)
			}
			wanted := strings.Contains(strings.Join(fires, ","), name)
			if res[0].Triggered != wanted {
				t.Errorf("%s on the %s Stack fired=%v, want %v", trigger, name, res[0].Triggered, wanted)
			}
		}
	}
	// Once per plan, per release, per drift: the key of "already sent".
	res, _ := a.RunTrigger("on-plan-pending", toObj(t, awaiting))
	if res[0].OncePer != "plan-4-abc" {
		t.Errorf("on-plan-pending once per %q, want the plan id", res[0].OncePer)
	}
	res, _ = a.RunTrigger("on-applied", toObj(t, applied))
	if res[0].OncePer != "3" {
		t.Errorf("on-applied once per %q, want the release", res[0].OncePer)
	}
}

// TestConfigMapReplacesBuiltins: a trigger or template of the ConfigMap
// wins over the built-in one of the same name.
func TestConfigMapReplacesBuiltins(t *testing.T) {
	a := engineAPI(t, map[string]string{
		"trigger.on-applied":   "- when: stack.metadata.name == 'web'\n  send: [applied]\n",
		"template.applied":     "message: 'custom {{.stack.metadata.name}}'\n",
		"service.webhook.hook": "url: http://127.0.0.1:1\n",
	}, nil)
	res, err := a.RunTrigger("on-applied", toObj(t, failing))
	if err != nil || !res[0].Triggered {
		t.Errorf("the ConfigMap's on-applied did not fire: %v %v", res, err)
	}
	if cfg := a.GetConfig(); cfg.Templates["applied"].Message != "custom {{.stack.metadata.name}}" || cfg.Templates["applied"].Webhook != nil {
		t.Errorf("template applied = %+v, want the ConfigMap's", cfg.Templates["applied"])
	}
}

// webhookReceiver records the bodies posted to it.
func webhookReceiver(t *testing.T) (*httptest.Server, <-chan string) {
	t.Helper()
	got := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Authorization") + " " + string(body)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// TestBuiltinTemplatesRender: the built-in templates give a webhook service
// a JSON body with the facts (revision, plan, summary), Slack and Teams a
// message; credentials come from the Secret.
func TestBuiltinTemplatesRender(t *testing.T) {
	srv, got := webhookReceiver(t)
	a := engineAPI(t, map[string]string{
		"service.webhook.receiver": "url: " + srv.URL + "/hook\nheaders:\n- name: Authorization\n  value: Bearer $receiver-token\n",
	}, map[string][]byte{"receiver-token": []byte("s3cret")})
	cases := []struct {
		stack    *terracev1.Stack
		template string
		want     map[string]string
	}{
		{awaiting, "plan-pending", map[string]string{"event": "plan-pending", "revision": "main@sha1:0123", "plan": "plan-4-abc", "summary": "+2 ~1 -0",
			"text": "Stack team-a/web: plan plan-4-abc (+2 ~1 -0) of main@sha1:0123 awaits approval; set spec.approvePlan to plan-4-abc to apply it"}},
		{applied, "applied", map[string]string{"event": "applied", "revision": "main@sha1:0123", "plan": "plan-4-abc", "reason": "Applied",
			"text": "Stack team-a/web: applied main@sha1:0123 (release 3)"}},
		{failing, "failed", map[string]string{"event": "failed", "revision": "main@sha1:0456", "reason": "PlanFailed",
			"text": "Stack team-a/web failed (PlanFailed): Error: Invalid reference"}},
		{drifted, "drift", map[string]string{"event": "drift", "plan": "plan-5-drift", "text": "Stack team-a/web: resources changed outside Terrace: ~1"}},
	}
	for _, tc := range cases {
		if err := a.Send(toObj(t, tc.stack), []string{tc.template}, services.Destination{Service: "receiver"}); err != nil {
			t.Fatalf("%s: %v", tc.template, err)
		}
		req := <-got
		prefix := "POST /hook Bearer s3cret "
		if !strings.HasPrefix(req, prefix) {
			t.Fatalf("%s: request %q, want it to start with %q", tc.template, req, prefix)
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(strings.TrimPrefix(req, prefix)), &body); err != nil {
			t.Fatalf("%s: body is not JSON: %v\n%s", tc.template, err, req)
		}
		for k, v := range tc.want {
			if body[k] != v {
				t.Errorf("%s: %s = %v, want %q", tc.template, k, body[k], v)
			}
		}
	}
}

// TestSubscriptionsOnlyChooseServices is the attack of a Stack author who
// annotates a Stack to make the controller send requests elsewhere: a
// service the ConfigMap does not define is refused, and a recipient cannot
// change where a webhook service posts.
func TestSubscriptionsOnlyChooseServices(t *testing.T) {
	srv, got := webhookReceiver(t)
	a := engineAPI(t, map[string]string{"service.webhook.receiver": "url: " + srv.URL + "/hook\n"}, nil)
	annotations := map[string]string{
		AnnotationPrefix + "/subscribe.on-applied.receiver": "http://attacker.invalid/steal",
		AnnotationPrefix + "/subscribe.on-applied.webhook":  "http://attacker.invalid/steal",
	}
	subscriptions.SetAnnotationPrefix(AnnotationPrefix)
	dests := subscriptions.NewAnnotations(annotations).GetDestinations(nil, nil)["on-applied"]
	if len(dests) != 2 {
		t.Fatalf("destinations %v, want the two annotated", dests)
	}
	for _, d := range dests {
		err := a.Send(toObj(t, applied), []string{"applied"}, d)
		switch d.Service {
		case "receiver":
			if err != nil {
				t.Fatalf("the configured service: %v", err)
			}
			if req := <-got; !strings.HasPrefix(req, "POST /hook ") {
				t.Errorf("the configured service posted %q, want to its own URL", req)
			}
		default:
			if err == nil || !strings.Contains(err.Error(), "not supported") {
				t.Errorf("service %q, which the ConfigMap does not define, was not refused: %v", d.Service, err)
			}
		}
	}
}

// TestOtherAnnotationsSubscribeNothing: a Stack's other annotations are no
// subscriptions, whatever order the engine reads them in.
func TestOtherAnnotationsSubscribeNothing(t *testing.T) {
	subscriptions.SetAnnotationPrefix(AnnotationPrefix)
	annotations := map[string]string{AnnotationPrefix + "/subscribe.on-applied.receiver": ""}
	for i := range 20 {
		annotations[fmt.Sprintf("example.com/other-%d", i)] = "x"
	}
	for range 10 {
		dests := withoutUnnamedServices(nil, subscriptions.NewAnnotations(annotations).GetDestinations(defaultTriggerNames, nil), api.Config{})
		if len(dests) != 1 || len(dests["on-applied"]) != 1 || dests["on-applied"][0].Service != "receiver" {
			t.Fatalf("destinations %v, want on-applied to receiver only", dests)
		}
	}
}
