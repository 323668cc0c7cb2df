package e2e

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/controller/stack"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// Tenancy attacks of issue 10 on outputs Secrets and varsFrom: a Stack
// author who may edit Stacks but not Secrets tries to overwrite, take over,
// delete or read the namespace's Secrets through Terrace.

const tenancyProgram = "tenancy"

var tenancyModule = map[string]string{"main.tf": `
variable "release" {
  type    = string
  default = "v1"
}
variable "password" {
  type      = string
  default   = ""
  sensitive = true
}
resource "terraform_data" "app" { input = var.release }
output "release" { value = terraform_data.app.output }
`}

func tenancyStack(name, outputsSecret string) *terracev1.Stack {
	st := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:          terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: tenancyProgram}},
			ApprovePlan:     terracev1.ApprovePlanAuto,
			DestroyOnDelete: true,
			RetryInterval:   &metav1.Duration{Duration: 2 * time.Second},
			DriftDetection:  &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
		},
	}
	if outputsSecret != "" {
		st.Spec.WriteOutputsToSecret = &terracev1.OutputsSecret{Name: outputsSecret}
	}
	return st
}

// secretNow reads a Secret as the API server holds it.
func (e *stackEnv) secretNow(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, sec); err != nil {
		t.Fatalf("Secret %s: %v", name, err)
	}
	return sec
}

// assertUntouched fails unless the Secret is exactly as before: same
// resourceVersion (never written), data, labels and ownerReferences.
func (e *stackEnv) assertUntouched(t *testing.T, before *corev1.Secret) {
	t.Helper()
	after := e.secretNow(t, before.Name)
	if after.ResourceVersion != before.ResourceVersion || !reflect.DeepEqual(after.Data, before.Data) ||
		!reflect.DeepEqual(after.Labels, before.Labels) || !reflect.DeepEqual(after.OwnerReferences, before.OwnerReferences) {
		t.Fatalf("Secret %s was changed:\nbefore rv=%s labels=%v owners=%+v keys=%d\nafter  rv=%s labels=%v owners=%+v keys=%d",
			before.Name, before.ResourceVersion, before.Labels, before.OwnerReferences, len(before.Data),
			after.ResourceVersion, after.Labels, after.OwnerReferences, len(after.Data))
	}
}

// refusedWith accepts a Stack stalled with reason whose message names all of parts.
func refusedWith(reason string, parts ...string) func(*terracev1.Stack) error {
	return func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, reason)(s); err != nil {
			return err
		}
		if err := conditionIs(terracev1.ReadyCondition, metav1.ConditionFalse, reason)(s); err != nil {
			return err
		}
		msg := outcome.Get(s, terracev1.ReadyCondition).Message
		for _, p := range parts {
			if !strings.Contains(msg, p) {
				return fmt.Errorf("the message does not say %q: %s", p, msg)
			}
		}
		return nil
	}
}

// pointOutputsAt applies a Stack with an outputs Secret of its own, then
// points writeOutputsToSecret at target and waits for the refusal: the
// Stack has applied, so its deletion runs destroy and removes stored data.
func (e *stackEnv) pointOutputsAt(t *testing.T, name, target string) {
	t.Helper()
	e.create(t, tenancyStack(name, name+"-outputs"))
	e.waitStack(t, name, stackTimeout, "Ready with its own outputs Secret", readyAt)
	if got := string(e.secretNow(t, name+"-outputs").Data["release"]); got != "v1" {
		t.Fatalf("own outputs Secret: release=%q", got)
	}
	e.updateStack(t, name, func(s *terracev1.Stack) { s.Spec.WriteOutputsToSecret.Name = target })
	e.waitStack(t, name, stackTimeout, "refused", refusedWith(stack.OutputsSecretConflictReason, "Secret "+target))
}

// deleteStack deletes a Stack and waits until its finalizer is done.
func (e *stackEnv) deleteStack(t *testing.T, name string) {
	t.Helper()
	if err := e.c.Delete(context.Background(), &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, stackTimeout, "Stack "+name+" deleted", func() error {
		return e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &terracev1.Stack{})
	})
}

// assertStillServing shows the controller serves another tenant after an attack.
func assertStillServing(t *testing.T) {
	t.Helper()
	other := newStackEnv(t)
	other.program(t, tenancyProgram, tenancyModule)
	other.create(t, tenancyStack("bystander", "bystander-outputs"))
	other.waitStack(t, "bystander", stackTimeout, "another namespace's Stack Ready after the attack", readyAt)
}

// A Stack cannot write into, take over or delete a Secret Terrace did not
// make for it: the OutputsSecretConflict refusal leaves it byte-identical,
// and destroyOnDelete deletes only the Stack's own outputs Secret.
func TestTenancyOutputsSecretCannotTakeOverASecret(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, tenancyProgram, tenancyModule)
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim", Labels: map[string]string{"team": "db"}},
		StringData: map[string]string{"password": "do-not-touch"}})
	victim := e.secretNow(t, "victim")

	// Named from the start: refused before anything runs.
	e.create(t, tenancyStack("direct", "victim"))
	st := e.waitStack(t, "direct", stackTimeout, "refused", refusedWith(stack.OutputsSecretConflictReason,
		"Secret victim", "Terrace did not create it", "spec.writeOutputsToSecret.name"))
	if st.Status.LastAppliedRevision != "" || st.Status.Release != nil {
		t.Errorf("the refused Stack applied: %+v", st.Status)
	}
	// Repointed after an apply: refused too, and its deletion with
	// destroyOnDelete removes its own outputs Secret only.
	e.pointOutputsAt(t, "repointed", "victim")
	e.assertUntouched(t, victim)

	// Renamed to a free name, the outputs move there and the old Secret goes
	// (a plan without changes: the outputs are synced, not re-applied).
	e.updateStack(t, "repointed", func(s *terracev1.Stack) { s.Spec.WriteOutputsToSecret.Name = "repointed-renamed" })
	e.waitStack(t, "repointed", stackTimeout, "Ready with the renamed outputs Secret", readyAt)
	if got := string(e.secretNow(t, "repointed-renamed").Data["release"]); got != "v1" {
		t.Fatalf("renamed outputs Secret: release=%q", got)
	}
	secretGone := func(name string) func() error {
		return func() error {
			return e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &corev1.Secret{})
		}
	}
	waitGone(t, 30*time.Second, "the outputs Secret of the old name removed", secretGone("repointed-outputs"))
	// Pointed at the victim again and deleted with destroyOnDelete.
	e.updateStack(t, "repointed", func(s *terracev1.Stack) { s.Spec.WriteOutputsToSecret.Name = "victim" })
	e.waitStack(t, "repointed", stackTimeout, "refused again", refusedWith(stack.OutputsSecretConflictReason, "Secret victim"))

	e.deleteStack(t, "direct")
	e.deleteStack(t, "repointed")
	e.assertUntouched(t, victim)
	if string(e.secretNow(t, "victim").Data["password"]) != "do-not-touch" {
		t.Fatal("the victim's value changed")
	}
	waitGone(t, 30*time.Second, "the Stack's own outputs Secret removed on deletion", secretGone("repointed-renamed"))
	assertStillServing(t)
}

// A Stack pointed at another Stack's state Secret is refused; that state
// keeps its serial and lineage through the attacker's deletion, and its
// Stack keeps applying.
func TestTenancyOutputsSecretCannotOverwriteAnotherStacksState(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, tenancyProgram, tenancyModule)
	e.create(t, tenancyStack("owner", ""))
	e.waitStack(t, "owner", stackTimeout, "Ready", readyAt)
	before, _ := e.stateOf(t, "owner")
	var index corev1.SecretList
	if err := e.c.List(context.Background(), &index, client.InNamespace(e.ns), client.MatchingLabels{
		secrets.LabelStack: "owner", secrets.LabelKind: secrets.KindStateIndex,
	}); err != nil || len(index.Items) != 1 {
		t.Fatalf("state index Secret of owner: %d found, %v", len(index.Items), err)
	}
	stateSecret := index.Items[0].DeepCopy()

	e.pointOutputsAt(t, "thief", stateSecret.Name)
	e.assertUntouched(t, stateSecret)
	e.deleteStack(t, "thief")
	e.assertUntouched(t, stateSecret)
	after, _ := e.stateOf(t, "owner")
	if after.Serial != before.Serial || after.Lineage != before.Lineage || after.Digest != before.Digest {
		t.Fatalf("owner's state changed: serial %d→%d lineage %s→%s", before.Serial, after.Serial, before.Lineage, after.Lineage)
	}
	// The state still works for its Stack.
	e.updateStack(t, "owner", func(s *terracev1.Stack) { s.Spec.Vars = jsonVars(t, map[string]any{"release": "v2"}) })
	e.waitStack(t, "owner", stackTimeout, "Ready after a new apply", readyAt)
	if next, _ := e.stateOf(t, "owner"); next.Lineage != before.Lineage || next.Serial <= before.Serial {
		t.Fatalf("owner's next apply: serial %d→%d lineage %s→%s", before.Serial, next.Serial, before.Lineage, next.Lineage)
	}
	assertStillServing(t)
}

// varsFrom is read with the rights of the runner's ServiceAccount: a Secret
// it may not get is refused, its value appears nowhere, and a Role granting
// it is all that is needed.
func TestTenancyVarsFromNeedsTheServiceAccountsRights(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, tenancyProgram, tenancyModule)
	token := secretToken(t)
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db-admin"}, StringData: map[string]string{"password": token}})
	reader := tenancyStack("reader", "")
	reader.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: "db-admin"}}
	e.create(t, reader)
	st := e.waitStack(t, "reader", stackTimeout, "refused", refusedWith(stack.VarsSourceForbiddenReason,
		"spec.varsFrom[0]", "ServiceAccount default", "Secret "+e.ns+"/db-admin", "rolebinding"))
	if st.Status.LastAttemptedRevision != "" {
		t.Errorf("a run started with a forbidden input: %+v", st.Status)
	}
	// A Secret that does not exist gets the same answer: no existence oracle.
	e.updateStack(t, "reader", func(s *terracev1.Stack) {
		s.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: "no-such-secret", Optional: true}}
	})
	e.waitStack(t, "reader", stackTimeout, "refused", refusedWith(stack.VarsSourceForbiddenReason, "Secret "+e.ns+"/no-such-secret"))
	e.assertNoSecretAnywhere(t, "reader", token)

	// Granted, the same Stack reads it.
	e.allowRunnerToRead(t, "db-admin")
	e.updateStack(t, "reader", func(s *terracev1.Stack) {
		s.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: "db-admin"}}
	})
	e.waitStack(t, "reader", stackTimeout, "Ready once the ServiceAccount may read the Secret", readyAt)
	e.assertNoSecretAnywhere(t, "reader", token)
	assertStillServing(t)
}
