package apiserver

import (
	"context"
	"net/http"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/ownership"
)

func (at *apiTest) foreignSecret(name string, owners ...metav1.OwnerReference) *corev1.Secret {
	at.t.Helper()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: name, Labels: map[string]string{"team": "db"}, OwnerReferences: owners},
		Data:       map[string][]byte{"password": []byte("do-not-touch")},
	}
	if err := env.Client.Create(context.Background(), sec); err != nil {
		at.t.Fatal(err)
	}
	return sec
}

func (at *apiTest) assertUntouched(before *corev1.Secret) {
	at.t.Helper()
	after := at.secret(before.Name)
	if after.ResourceVersion != before.ResourceVersion || !reflect.DeepEqual(after.Data, before.Data) ||
		!reflect.DeepEqual(after.Labels, before.Labels) || !reflect.DeepEqual(after.OwnerReferences, before.OwnerReferences) {
		at.t.Fatalf("Secret %s was changed: %+v", before.Name, after)
	}
}

func TestValuesSecretIsMarkedAsTheInstallationsOwn(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)
	if secret, stack := at.secret("web-values"), at.stack("web"); !ownership.Owns(secret, stack, ownership.ComponentValues) {
		t.Fatalf("the values Secret is not marked as the installation's: labels %v owners %+v", secret.Labels, secret.OwnerReferences)
	}
}

// The API writes values only into the Secret it created for the
// installation: any other Secret of that name is answered 409 and left as it was.
func TestValuesAreNeverWrittenIntoAnotherSecret(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()

	// Create: a values or outputs Secret of the name exists already.
	values := at.foreignSecret("web-values")
	at.expectError(http.StatusConflict, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), "Secret web-values", "leaves it untouched")
	at.assertUntouched(values)
	outputs := at.foreignSecret("db-outputs")
	at.expectError(http.StatusConflict, at.admin, http.MethodPost, "/v1/installations", validCreate("db"), "Secret db-outputs", "choose another installation name")
	at.assertUntouched(outputs)
	for _, name := range []string{"web", "db"} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: name}, &terracev1.Stack{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a refused create left Stack %s behind: %v", name, err)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: "db-values"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a refused create left db-values behind: %v", err)
	}

	// PUT values: the installation's own Secret was replaced by another one,
	// even one that lists the Stack as a (non-controller) owner.
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("app"), nil)
	stack := at.stack("app")
	if err := env.Client.Delete(ctx, at.secret("app-values")); err != nil {
		t.Fatal(err)
	}
	replaced := at.foreignSecret("app-values", metav1.OwnerReference{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack", Name: "app", UID: stack.UID})
	at.expectError(http.StatusConflict, at.admin, http.MethodPut, "/v1/installations/app/values",
		map[string]any{"values": map[string]any{"replicas": 1}}, "Secret app-values", "not created by Terrace for installation app")
	at.assertUntouched(replaced)
}
