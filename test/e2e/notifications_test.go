package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/notify"
)

// receivedNotifications is what the receiver pod lists at GET /received.
type receivedNotifications struct {
	Flux     []eventv1.Event   `json:"flux"`
	Webhooks []json.RawMessage `json:"webhooks"`
}

// TestNotificationsReachAReceiverPod: Terrace's events reach a receiver pod
// in the cluster both ways of issue #46 item 4: in Flux's event format
// (--events-address, as a notification-controller receives them) and as a
// generic webhook the operator's ConfigMap defines and a Stack's annotation
// subscribes to; both carry the applied revision.
func TestNotificationsReachAReceiverPod(t *testing.T) {
	e := newStackEnv(t)
	ctx := context.Background()

	// The receiver: the Terrace image's pod fixture behind a Service.
	labels := map[string]string{"app": "receiver"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "receiver", Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: terraceImage, Args: []string{"dev", "pod-fixture", "--listen=$(POD_IP):8080"},
			Env:            []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
		}}},
	}
	if _, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := e.cs.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "receiver"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(t, e.cs, e.ns, "receiver", 60*time.Second, "Ready", func(p *corev1.Pod) error {
		if !podReady(p) {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	// The controller runs in this process, on the host, which routes the
	// Service range to the node but does not resolve the cluster's names:
	// it posts to the ClusterIP (in a cluster: receiver.<ns>.svc).
	receiver := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	eventually(t, 30*time.Second, "the receiver Service answering", func() error {
		_, err := httpGet(receiver, "/received")
		return err
	})

	// (a) Flux's way: the controller with --events-address.
	controllerEventsAddress = "http://" + receiver + "/flux"
	restartController(t, e.dev)
	t.Cleanup(func() {
		controllerEventsAddress = ""
		restartController(t, e.dev)
	})
	// (b) Everyone else's: a webhook service in the operator's ConfigMap.
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: notify.DefaultConfigMapName, Namespace: operatorNamespace},
		Data:       map[string]string{"service.webhook.receiver": "url: http://" + receiver + "/webhook\n"},
	}
	if err := e.c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), cm) })

	e.program(t, "notified", map[string]string{"main.tf": `
resource "terraform_data" "site" { input = "v1" }
output "site" { value = terraform_data.site.output }
`})
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "notified", Annotations: map[string]string{
			notify.AnnotationPrefix + "/subscribe.on-applied.receiver": "",
		}},
		Spec: terracev1.StackSpec{
			Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "notified"}},
			ApprovePlan: terracev1.ApprovePlanAuto,
		},
	})
	st := e.waitStack(t, "notified", stackTimeout, "Ready", readyAt)
	revision := st.Status.LastAppliedRevision
	if revision == "" {
		t.Fatal("no status.lastAppliedRevision")
	}

	var got receivedNotifications
	eventually(t, 60*time.Second, "the applied event both ways", func() error {
		body, err := httpGet(receiver, "/received")
		if err != nil {
			return err
		}
		got = receivedNotifications{}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			return err
		}
		if fluxApplied(got.Flux, e.ns, revision) == nil {
			return fmt.Errorf("no Flux event Applied with revision %s among %d", revision, len(got.Flux))
		}
		if webhookApplied(got.Webhooks, e.ns, revision) == nil {
			return fmt.Errorf("no webhook applied with revision %s among %d", revision, len(got.Webhooks))
		}
		return nil
	})
	flux := fluxApplied(got.Flux, e.ns, revision)
	if flux.Severity != eventv1.EventSeverityInfo || flux.InvolvedObject.APIVersion != terracev1.GroupVersion.String() || flux.Metadata["terrace.dev/plan"] == "" || flux.Metadata["terrace.dev/summary"] != "+1 ~0 -0" {
		t.Errorf("Flux event: %+v", flux)
	}
	hook := webhookApplied(got.Webhooks, e.ns, revision)
	t.Logf("Flux event: %s %s %q %v; webhook: %v", flux.Severity, flux.Reason, flux.Message, flux.Metadata, hook)
	// The controller remembers what it sent on the Stack, so a restart
	// does not send it again. The engine writes it after the delivery.
	eventually(t, 30*time.Second, "the notified annotation", func() error {
		if ann := e.getStack(t, "notified").Annotations["notified."+notify.AnnotationPrefix]; ann == "" {
			return fmt.Errorf("no notified.%s annotation on the Stack", notify.AnnotationPrefix)
		}
		return nil
	})
}

// fluxApplied is the Applied event of Stack ns/notified for revision.
func fluxApplied(events []eventv1.Event, ns, revision string) *eventv1.Event {
	for i, ev := range events {
		if ev.InvolvedObject.Kind == "Stack" && ev.InvolvedObject.Namespace == ns && ev.InvolvedObject.Name == "notified" &&
			ev.Reason == "Applied" && ev.Metadata["terrace.dev/revision"] == revision {
			return &events[i]
		}
	}
	return nil
}

// webhookApplied is the built-in applied template's JSON body for Stack
// ns/notified at revision.
func webhookApplied(bodies []json.RawMessage, ns, revision string) map[string]any {
	for _, b := range bodies {
		var m map[string]any
		if json.Unmarshal(b, &m) == nil && m["event"] == "applied" && m["namespace"] == ns && m["name"] == "notified" && m["revision"] == revision {
			return m
		}
	}
	return nil
}
