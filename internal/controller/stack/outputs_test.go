package stack

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/ownership"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/scheme"
)

const outputsNS = "team"

func outputsStack(name, uid, secretName string) *terracev1.Stack {
	st := &terracev1.Stack{
		TypeMeta:   metav1.TypeMeta{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: outputsNS, UID: types.UID(uid)},
	}
	if secretName != "" {
		st.Spec.WriteOutputsToSecret = &terracev1.OutputsSecret{Name: secretName}
	}
	return st
}

// ownedBy is an outputs Secret as Terrace makes it for stack.
func ownedBy(stack *terracev1.Stack, name string) *corev1.Secret {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: outputsNS}, Data: map[string][]byte{"old": []byte("1")}}
	if err := ownership.Claim(sec, stack, ownership.ComponentOutputs, scheme.New()); err != nil {
		panic(err)
	}
	return sec
}

func victimSecret(name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: outputsNS, Labels: map[string]string{"team": "db"}},
		Data:       map[string][]byte{"password": []byte("do-not-touch")},
	}
}

func outputsReconciler(objs ...client.Object) (*Reconciler, client.Client) {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).Build()
	return &Reconciler{Client: c, APIReader: c}, c
}

func getSecret(t *testing.T, c client.Client, name string) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: outputsNS, Name: name}, sec); err != nil {
		t.Fatalf("Secret %s: %v", name, err)
	}
	return sec
}

func someOutputs() map[string]runner.Output {
	return map[string]runner.Output{
		"url":   {Value: json.RawMessage(`"https://app"`)},
		"ports": {Value: json.RawMessage(`[80,443]`)},
	}
}

func TestOutputsSecretIsCreatedAsTerracesOwn(t *testing.T) {
	stack := outputsStack("web", "uid-web", "web-outputs")
	stack.Spec.WriteOutputsToSecret.Labels = map[string]string{"app": "web", ownership.LabelManagedBy: "someone-else"}
	r, c := outputsReconciler()
	if err := r.writeOutputs(context.Background(), &scope{stack: stack}, someOutputs()); err != nil {
		t.Fatal(err)
	}
	sec := getSecret(t, c, "web-outputs")
	if string(sec.Data["url"]) != "https://app" || string(sec.Data["ports"]) != "[80,443]" {
		t.Errorf("data: %q", sec.Data)
	}
	if !ownership.Owns(sec, stack, ownership.ComponentOutputs) {
		t.Fatalf("the created Secret is not marked as this Stack's: labels %v, owners %+v", sec.Labels, sec.OwnerReferences)
	}
	if sec.Labels["app"] != "web" || sec.Labels["terrace.dev/stack"] != "web" {
		t.Errorf("labels: %v", sec.Labels)
	}
	// The same Stack writes into its own Secret again.
	if err := r.writeOutputs(context.Background(), &scope{stack: stack}, map[string]runner.Output{"url": {Value: json.RawMessage(`"https://v2"`)}}); err != nil {
		t.Fatal(err)
	}
	if sec := getSecret(t, c, "web-outputs"); string(sec.Data["url"]) != "https://v2" || len(sec.Data) != 1 {
		t.Errorf("rewritten data: %q", sec.Data)
	}
	// A later Stack of the same name (another UID) does not own it.
	again := outputsStack("web", "uid-web-2", "web-outputs")
	if err := r.checkOutputsSecret(context.Background(), &scope{stack: again}); !isConflict(err) {
		t.Fatalf("a recreated Stack took over the old Stack's Secret: %v", err)
	}
}

func isConflict(err error) bool {
	var terminal *outcome.TerminalError
	return errors.As(err, &terminal) && terminal.Reason == OutputsSecretConflictReason
}

// Every Secret that is not this Stack's own outputs Secret is refused as
// the target, left byte-identical, and never deleted.
func TestOutputsSecretNeverTakesOverAnotherSecret(t *testing.T) {
	attacker := outputsStack("attacker", "uid-attacker", "")
	other := outputsStack("other", "uid-other", "")
	labelledOnly := victimSecret("victim")
	labelledOnly.Labels = map[string]string{ownership.LabelManagedBy: ownership.ManagedByTerrace, ownership.LabelComponent: ownership.ComponentOutputs}
	stateSecret := victimSecret("victim")
	stateSecret.Labels = map[string]string{ownership.LabelManagedBy: ownership.ManagedByTerrace, "terrace.dev/stack": "other", "terrace.dev/kind": "state-index"}
	notController := ownedBy(attacker, "victim")
	notController.OwnerReferences[0].Controller = ptr.To(false)
	cases := []struct {
		name   string
		victim *corev1.Secret
		says   string
	}{
		{"a Secret Terrace did not make", victimSecret("victim"), "Terrace did not create it"},
		{"another Stack's outputs Secret", ownedBy(other, "victim"), "belongs to Stack other"},
		{"Terrace's labels without an owner", labelledOnly, "Terrace keeps other data in it"},
		{"another Stack's state", stateSecret, "Terrace keeps other data in it"},
		{"owned by the Stack but not as controller", notController, "victim"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			r, c := outputsReconciler(tc.victim)
			before := getSecret(t, c, "victim")
			stack := attacker.DeepCopy()
			stack.Spec.WriteOutputsToSecret = &terracev1.OutputsSecret{Name: "victim"}
			s := &scope{stack: stack}

			err := r.checkOutputsSecret(ctx, s)
			if !isConflict(err) || !strings.Contains(err.Error(), "Secret victim") || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("checkOutputsSecret = %v", err)
			}
			if err := r.writeOutputs(ctx, s, someOutputs()); !isConflict(err) {
				t.Fatalf("writeOutputs = %v", err)
			}
			// Deletion of the Stack, with the field still naming it.
			if err := r.removeOutputsSecrets(ctx, s, ""); err != nil {
				t.Fatal(err)
			}
			if after := getSecret(t, c, "victim"); !reflect.DeepEqual(before, after) {
				t.Fatalf("the Secret changed:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}

func TestRenamedOutputsSecretReplacesTheOldOne(t *testing.T) {
	ctx := context.Background()
	stack := outputsStack("web", "uid-web", "web-out-b")
	other := outputsStack("other", "uid-other", "")
	r, c := outputsReconciler(ownedBy(stack, "web-out-a"), ownedBy(other, "other-out"), victimSecret("victim"))
	// The first write of a Stack (no name recorded yet) searches the
	// namespace for its outputs Secrets of other names.
	first := &scope{stack: stack}
	if err := r.writeOutputs(ctx, first, someOutputs()); err != nil {
		t.Fatal(err)
	}
	recordRun(first)
	if stack.Status.OutputsSecret != "web-out-b" {
		t.Fatalf("status.outputsSecret = %q after writing web-out-b", stack.Status.OutputsSecret)
	}
	if sec := getSecret(t, c, "web-out-b"); string(sec.Data["url"]) != "https://app" {
		t.Errorf("new outputs Secret: %q", sec.Data)
	}
	err := c.Get(ctx, client.ObjectKey{Namespace: outputsNS, Name: "web-out-a"}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the outputs Secret of the old name is still there: %v", err)
	}
	getSecret(t, c, "other-out")
	getSecret(t, c, "victim")

	// Unsetting the field removes the Stack's outputs Secret (the one the
	// status names), nothing else.
	stack.Spec.WriteOutputsToSecret = nil
	second := &scope{stack: stack}
	if err := r.writeOutputs(ctx, second, someOutputs()); err != nil {
		t.Fatal(err)
	}
	recordRun(second)
	if stack.Status.OutputsSecret != "" {
		t.Errorf("status.outputsSecret = %q after the Secret was removed", stack.Status.OutputsSecret)
	}
	err = c.Get(ctx, client.ObjectKey{Namespace: outputsNS, Name: "web-out-b"}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the outputs Secret is still there after the field was unset: %v", err)
	}
	getSecret(t, c, "other-out")
}

// The field is not trusted at deletion: an owned Secret replaced by another
// one of the same name since the last write survives the Stack's deletion.
func TestDeletionRechecksOwnership(t *testing.T) {
	ctx := context.Background()
	stack := outputsStack("web", "uid-web", "web-outputs")
	r, c := outputsReconciler(ownedBy(stack, "web-outputs"), ownedBy(stack, "web-old"))
	if err := c.Delete(ctx, getSecret(t, c, "web-outputs")); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, victimSecret("web-outputs")); err != nil {
		t.Fatal(err)
	}
	before := getSecret(t, c, "web-outputs")
	stack.DeletionTimestamp = ptr.To(metav1.Now())
	if err := r.removeOutputsSecrets(ctx, &scope{stack: stack}, ""); err != nil {
		t.Fatal(err)
	}
	if after := getSecret(t, c, "web-outputs"); !reflect.DeepEqual(before, after) {
		t.Fatalf("the replacement Secret changed: %+v", after)
	}
	err := c.Get(ctx, client.ObjectKey{Namespace: outputsNS, Name: "web-old"}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the Stack's own older outputs Secret was kept: %v", err)
	}
}
