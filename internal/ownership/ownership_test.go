package ownership

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
)

func TestOwnsOnlyWhatWasClaimedForThisOwnerAndRole(t *testing.T) {
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", UID: "uid-1"}}
	claimed := func(mutate func(*corev1.Secret)) *corev1.Secret {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: "team"}}
		if err := Claim(sec, stack, ComponentOutputs, scheme.New()); err != nil {
			t.Fatal(err)
		}
		if mutate != nil {
			mutate(sec)
		}
		return sec
	}
	sameNameNewUID := stack.DeepCopy()
	sameNameNewUID.UID = "uid-2"
	noUID := stack.DeepCopy()
	noUID.UID = ""
	cases := []struct {
		name      string
		secret    *corev1.Secret
		owner     *terracev1.Stack
		component string
		want      bool
	}{
		{"claimed", claimed(nil), stack, ComponentOutputs, true},
		{"other role", claimed(nil), stack, ComponentValues, false},
		{"a later owner of the same name", claimed(nil), sameNameNewUID, ComponentOutputs, false},
		{"an owner without a UID", claimed(func(s *corev1.Secret) { s.OwnerReferences[0].UID = "" }), noUID, ComponentOutputs, false},
		{"not the controller", claimed(func(s *corev1.Secret) { s.OwnerReferences[0].Controller = ptr.To(false) }), stack, ComponentOutputs, false},
		{"labels removed", claimed(func(s *corev1.Secret) { delete(s.Labels, LabelManagedBy) }), stack, ComponentOutputs, false},
		{"no owner", claimed(func(s *corev1.Secret) { s.OwnerReferences = nil }), stack, ComponentOutputs, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Owns(tc.secret, tc.owner, tc.component); got != tc.want {
				t.Fatalf("Owns = %v, want %v", got, tc.want)
			}
		})
	}
	// Another controller's object is never claimed.
	otherStack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "team", UID: "uid-3"}}
	if err := Claim(claimed(nil), otherStack, ComponentOutputs, scheme.New()); err == nil {
		t.Fatal("claimed an object another owner controls")
	}
}
