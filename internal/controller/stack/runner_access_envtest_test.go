package stack

import (
	"context"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// TestEnvtestRunnerPodSpecAttacks is issue 44 item 2 against a real API
// server and its RBAC authorizer: in a namespace whose runner
// ServiceAccount may read no Secret, each Stack of runnerAttacks (a Secret
// volume, a projected volume, a token for another audience, a secretKeyRef
// env, envFrom a Secret, a claim, a foreign ServiceAccount, a terrace.dev
// label, an unconfined AppArmor annotation) is Stalled with its reason
// and the field named, and no runner is started for it. The refused
// Secret-volume Stack runs once its namespace grants the read.
func TestEnvtestRunnerPodSpecAttacks(t *testing.T) {
	e := newSuiteEnv(t)
	ctx := context.Background()
	victim := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: e.ns}, StringData: map[string]string{"password": "do-not-touch"}}
	if err := e.c.Create(ctx, victim); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	started := map[string]bool{}
	for _, a := range runnerAttacks {
		name := attackStackName(a.name)
		suite.hooks.onRunnerStarted(e.ns, name, func() {
			mu.Lock()
			defer mu.Unlock()
			started[name] = true
		})
		e.stack(name, dataModule, map[string]string{"greeting": "hi"}, func(st *terracev1.Stack) {
			st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
			st.Spec.Runner = a.tmpl.DeepCopy()
			st.Spec.ServiceAccountName = a.sa
		})
	}

	for _, a := range runnerAttacks {
		name := attackStackName(a.name)
		st := e.waitFor(name, "Stalled with "+a.reason, is(terracev1.StalledCondition, "True", a.reason))
		ready := outcome.Get(st, terracev1.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != a.reason || !strings.Contains(ready.Message, a.field) {
			t.Errorf("%s: Ready %+v, want False/%s naming %s", name, ready, a.reason, a.field)
		}
		if st.Status.LastRun != "" || st.Status.Plan != nil || st.Status.LastAppliedRevision != "" {
			t.Errorf("%s: a run was started: %+v", name, st.Status)
		}
		if strings.Contains(conditionsText(st), "do-not-touch") {
			t.Errorf("%s: the Secret's value is in the status", name)
		}
	}
	mu.Lock()
	for name := range started {
		t.Errorf("a runner was started for the refused Stack %s", name)
	}
	mu.Unlock()

	// Granting the runner's account the read is all it takes.
	e.grantSecretReads("default")
	e.request(attackStackName("a Secret volume"))
	e.waitFor(attackStackName("a Secret volume"), "applied once granted", readyAt)
}

// secretAttacks are the attacks on a Secret that grantSecretReads allows.
var secretAttacks = map[string]bool{"a Secret volume": true, "a projected volume": true, "a secretKeyRef env": true, "envFrom a Secret": true}

// TestEnvtestRunnerObjectsTheAccountMayReadRun is the allowed case: the
// pod specs of the Secret attacks run where the runner's account may get
// the Secret (the namespace's RBAC already gave it to whoever runs as it).
func TestEnvtestRunnerObjectsTheAccountMayReadRun(t *testing.T) {
	e := newSuiteEnv(t)
	e.grantSecretReads("default")
	if err := e.c.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: e.ns}, StringData: map[string]string{"password": "granted"}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range runnerAttacks {
		if secretAttacks[a.name] {
			e.stack(attackStackName(a.name), dataModule, map[string]string{"greeting": "hi"}, func(st *terracev1.Stack) {
				st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
				st.Spec.Runner = a.tmpl.DeepCopy()
			})
		}
	}
	for _, a := range runnerAttacks {
		if secretAttacks[a.name] {
			e.waitFor(attackStackName(a.name), "applied", readyAt)
		}
	}
}

// attackStackName turns an attack's name into a Stack name.
func attackStackName(attack string) string {
	name := strings.TrimPrefix(strings.TrimPrefix(attack, "an "), "a ")
	return strings.ToLower(strings.NewReplacer(" ", "-", ".", "-").Replace(name))
}
