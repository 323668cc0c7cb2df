package stack

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	terracesettings "github.com/terrace-dev/terrace/internal/settings"
)

func backendStack(config string) *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: outputsNS},
		Spec: terracev1.StackSpec{Workspace: "default", Backend: &terracev1.StackBackend{
			Type:   "pg",
			Config: map[string]apiextensionsv1.JSON{"schema_name": {Raw: []byte(config)}},
			Credentials: []terracev1.BackendCredential{
				{Env: "PG_CONN_STR", SecretKeyRef: terracev1.SecretKeyReference{Name: "pg", Key: "url"}},
				{Env: "GOOGLE_APPLICATION_CREDENTIALS", SecretKeyRef: terracev1.SecretKeyReference{Name: "pg", Key: "sa"}, AsFile: true},
			},
		}},
	}
}

// resolveBackend hands the runner the block and its credentials (read with
// the runner's ServiceAccount's rights), and makes the backend part of
// the inputs: another config or a rotated credential is a new plan, while
// the credential's value never enters the digest.
func TestResolveBackend(t *testing.T) {
	const url = "postgres://u:hunter2@db/x"
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: outputsNS}, Data: map[string][]byte{"url": []byte(url), "sa": []byte("{}")}}
	auth := &authorizer{grants: map[string]bool{"system:serviceaccount:team:default get secrets/pg": true}}
	c := auth.client(sec)
	r := &Reconciler{Client: c, APIReader: c}
	resolve := func(stack *terracev1.Stack) (*scope, error) {
		s := &scope{stack: stack, source: &source{digest: "sha256:src"}, inputs: &inputs{digest: "sha256:base"}, config: terracesettings.Effective{ServiceAccountName: "default"}}
		return s, r.resolveBackend(context.Background(), s)
	}

	plain, err := resolve(&terracev1.Stack{})
	if err != nil || plain.backend != nil || plain.inputs.digest != "sha256:base" {
		t.Fatalf("a Stack without spec.backend: %v %+v %s", err, plain.backend, plain.inputs.digest)
	}
	if req := r.initRequest(plain); req.GetHttpBackend() == nil || req.GetOwnBackend() != nil {
		t.Fatalf("init request without spec.backend: %+v", req)
	}

	s, err := resolve(backendStack(`"team"`))
	if err != nil {
		t.Fatal(err)
	}
	b := s.backend
	if b.GetType() != "pg" || string(b.GetConfigJson()) != `{"schema_name":"team"}` || len(b.GetCredentials()) != 2 ||
		b.GetCredentials()[0].GetValue() != url || !b.GetCredentials()[1].GetAsFile() {
		t.Fatalf("backend %+v", b)
	}
	if req := r.initRequest(s); req.GetHttpBackend() != nil || req.GetOwnBackend() != b || req.GetWorkspace() != "default" {
		t.Fatalf("init request: %+v", req)
	}
	if s.inputs.digest == "sha256:base" || strings.Contains(s.inputs.digest, "hunter2") {
		t.Fatalf("digest %s", s.inputs.digest)
	}
	same, _ := resolve(backendStack(`"team"`))
	other, _ := resolve(backendStack(`"other"`))
	live := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(sec), live); err != nil {
		t.Fatal(err)
	}
	live.Data["url"] = []byte(url + "?rotated")
	if err := c.Update(context.Background(), live); err != nil {
		t.Fatal(err)
	}
	rotated, _ := resolve(backendStack(`"team"`))
	if same.inputs.digest != s.inputs.digest || other.inputs.digest == s.inputs.digest || rotated.inputs.digest == s.inputs.digest {
		t.Fatalf("digests: same %s, other %s, rotated %s, first %s", same.inputs.digest, other.inputs.digest, rotated.inputs.digest, s.inputs.digest)
	}

	missingKey := backendStack(`"team"`)
	missingKey.Spec.Backend.Credentials[0].SecretKeyRef.Key = "password"
	_, err = resolve(missingKey)
	var terminal *outcome.TerminalError
	if !errors.As(err, &terminal) || terminal.Reason != BackendCredentialsNotFoundReason || !strings.Contains(err.Error(), `spec.backend.credentials[0]: Secret team/pg has no key "password"`) {
		t.Fatalf("missing key: %v", err)
	}
	forbidden := backendStack(`"team"`)
	forbidden.Spec.Backend.Credentials[1].SecretKeyRef.Name = "admin"
	_, err = resolve(forbidden)
	if !errors.As(err, &terminal) || terminal.Reason != BackendCredentialsForbiddenReason || !strings.Contains(err.Error(), "spec.backend.credentials[1]: ServiceAccount default") {
		t.Fatalf("forbidden: %v", err)
	}
}
