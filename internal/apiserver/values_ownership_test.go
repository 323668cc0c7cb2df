package apiserver

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"connectrpc.com/connect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/ownership"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
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
	if secret, stack := at.valuesSecret("web"), at.stack("web"); !ownership.Owns(secret, stack, ownership.ComponentValues) {
		t.Fatalf("the values Secret is not marked as the installation's: labels %v owners %+v", secret.Labels, secret.OwnerReferences)
	}
}

// The API writes values only into the Secret it created for the
// installation: any other Secret of that name is answered 409 and left as it was.
func TestValuesAreNeverWrittenIntoAnotherSecret(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()

	// Create: a Secret named like a values Secret exists already. The
	// values Secret's name is generated, so the create goes ahead beside it.
	values := at.foreignSecret("web-values")
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)
	at.assertUntouched(values)
	if got := at.valuesSecret("web").Name; got == values.Name {
		t.Fatalf("the installation reads the foreign Secret %s", got)
	}
	// An outputs Secret of the name exists already.
	outputs := at.foreignSecret("db-outputs")
	at.expectError(http.StatusConflict, at.admin, http.MethodPost, "/v1/installations", validCreate("db"), "Secret db-outputs", "choose another installation name")
	at.assertUntouched(outputs)
	for _, name := range []string{"db"} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: name}, &terracev1.Stack{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a refused create left Stack %s behind: %v", name, err)
		}
	}
	for _, name := range at.valuesSecrets() {
		if strings.HasPrefix(name, "db-") {
			t.Fatalf("a refused create left %s behind", name)
		}
	}

	// PUT values: the installation's own Secret was replaced by another one,
	// even one that lists the Stack as a (non-controller) owner.
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("app"), nil)
	stack := at.stack("app")
	own := at.valuesSecret("app")
	if err := env.Client.Delete(ctx, own); err != nil {
		t.Fatal(err)
	}
	replaced := at.foreignSecret(own.Name, metav1.OwnerReference{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack", Name: "app", UID: stack.UID})
	at.expectError(http.StatusConflict, at.admin, http.MethodPut, "/v1/installations/app/values",
		map[string]any{"values": map[string]any{"replicas": 1}}, "Secret "+own.Name, "not created by Terrace for installation app")
	at.assertUntouched(replaced)
}

// An installation may read an existing Secret instead of values: Terrace
// neither owns, writes nor deletes it.
func TestAnExistingValuesSecretIsNeitherOwnedNorDeleted(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	grpc := at.grpcClient()
	mine := at.foreignSecret("team-values")

	_, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}, ValuesSecret: "missing"}, at.admin))
	expectCode(t, err, connect.CodeFailedPrecondition, reasonNotFound, "valuesSecret missing does not exist")
	_, err = grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}, ValuesSecret: mine.Name,
		Values: mustStruct(t, map[string]any{"a": 1})}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonInvalidInput, "not both")
	if left := at.valuesSecrets(); len(left) != 1 {
		t.Fatalf("a refused create made Secrets: %v", left)
	}

	created, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}, ValuesSecret: mine.Name}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	if created.Msg.ValuesSecret != mine.Name || at.valuesSecret("web").Name != mine.Name {
		t.Fatalf("the installation does not read %s: %v", mine.Name, created.Msg)
	}
	at.assertUntouched(mine)
	_, err = grpc.UpdateValues(ctx, withToken(&apiv1.UpdateValuesRequest{Name: "web", Values: mustStruct(t, map[string]any{"a": 1})}, at.admin))
	expectCode(t, err, connect.CodeFailedPrecondition, reasonForeignSecret, "write the values into that Secret yourself")
	at.assertUntouched(mine)
	if _, err := grpc.Delete(ctx, withToken(&apiv1.DeleteRequest{Name: "web"}, at.admin)); err != nil {
		t.Fatal(err)
	}
	at.assertUntouched(mine)
}
