package apiserver

import (
	"context"
	"net/http"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func TestRequestsNeedAValidTokenAndPermission(t *testing.T) {
	at := newAPITest(t)

	code, _ := at.do("", http.MethodGet, "/healthz", nil)
	if code != http.StatusOK {
		t.Fatalf("/healthz without a token: %d", code)
	}
	if code, body := at.do("", http.MethodGet, "/readyz", nil); code != http.StatusOK {
		t.Fatalf("/readyz: %d %s", code, body)
	}

	at.expectError(http.StatusUnauthorized, "", http.MethodGet, "/v1/installations", nil, "a bearer token is required")
	at.expectError(http.StatusUnauthorized, "not-a-token", http.MethodGet, "/v1/installations", nil, "was not accepted")
	// A token that almost is one: the admin's with its signature altered.
	forged := at.admin[:len(at.admin)-4] + "AAAA"
	at.expectError(http.StatusUnauthorized, forged, http.MethodGet, "/v1/installations", nil, "was not accepted")

	who := "system:serviceaccount:" + at.namespace + ":nobody"
	at.expectError(http.StatusForbidden, at.nobody, http.MethodGet, "/v1/installations", nil,
		who+" may not list stacks.terrace.dev in namespace "+at.namespace)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodGet, "/v1/installations/web", nil, `may not get stacks.terrace.dev "web"`)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodPost, "/v1/installations", validCreate("web"), "may not create stacks.terrace.dev")
	at.expectError(http.StatusForbidden, at.nobody, http.MethodPost, "/v1/installations/web/approve", map[string]string{"planId": "plan-1-a"}, `may not update stacks.terrace.dev "web"`)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodDelete, "/v1/installations/web", nil, `may not delete stacks.terrace.dev "web"`)
	// Nothing was created by the refused request.
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations", nil, nil)
	var list InstallationList
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations", nil, &list)
	if len(list.Items) != 0 {
		t.Fatalf("a refused create made an installation: %+v", list.Items)
	}
}

func TestStacksPermissionAloneDoesNotReadSecrets(t *testing.T) {
	at := newAPITest(t)
	clientset := mustClientset(t)
	reader := serviceAccountToken(t, clientset, at.namespace, "reader", stackRules("get", "list"))
	creator := serviceAccountToken(t, clientset, at.namespace, "creator", stackRules("get", "list", "create"))

	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)
	at.expect(http.StatusOK, reader, http.MethodGet, "/v1/installations/web", nil, nil)
	at.expectError(http.StatusForbidden, reader, http.MethodGet, "/v1/installations/web/outputs", nil, `may not get secrets "web-outputs"`)
	at.expectError(http.StatusForbidden, reader, http.MethodGet, "/v1/installations/web/releases", nil, "may not list secrets")
	at.expectError(http.StatusForbidden, creator, http.MethodPost, "/v1/installations", validCreate("db"), "may not create secrets")
}

func TestBodiesAreBounded(t *testing.T) {
	at := newAPITest(t)
	huge := `{"name":"web","values":{"blob":"` + strings.Repeat("x", maxBodyBytes) + `"}}`
	at.expectError(http.StatusRequestEntityTooLarge, at.admin, http.MethodPost, "/v1/installations", huge, "larger than")
}

// TestTokenAudiences: a server that asks for its own audience refuses a
// token issued for another (such as the Kubernetes API server's, which any
// workload holding a mounted token has), and accepts one for its audience.
func TestTokenAudiences(t *testing.T) {
	const audience = "terrace-api.example"
	at := newAPITestWith(t, func(s *Server) { s.TokenAudiences = []string{audience} })
	clientset := mustClientset(t)

	// at.admin is a token for the API server's default audience.
	at.expectError(http.StatusUnauthorized, at.admin, http.MethodGet, "/v1/installations", nil, "was not accepted", `not issued for the audience "`+audience+`"`)
	other := audienceToken(t, clientset, at.namespace, "installer", "some-other-service")
	at.expectError(http.StatusUnauthorized, other, http.MethodGet, "/v1/installations", nil, "was not accepted")

	ours := audienceToken(t, clientset, at.namespace, "installer", audience)
	at.expect(http.StatusOK, ours, http.MethodGet, "/v1/installations", nil, nil)
	// The audience decides who the caller is, not what they may do.
	nobody := audienceToken(t, clientset, at.namespace, "nobody", audience)
	at.expectError(http.StatusForbidden, nobody, http.MethodGet, "/v1/installations", nil, "may not list stacks.terrace.dev")

	// A server without audiences takes the default-audience token and
	// refuses one bound to another service.
	plain := newAPITest(t)
	plain.expect(http.StatusOK, plain.admin, http.MethodGet, "/v1/installations", nil, nil)
	foreign := audienceToken(t, clientset, plain.namespace, "installer", audience)
	plain.expectError(http.StatusUnauthorized, foreign, http.MethodGet, "/v1/installations", nil, "was not accepted")
}

// audienceToken returns a token of an existing ServiceAccount issued for audience.
func audienceToken(t *testing.T, cs kubernetes.Interface, ns, sa, audience string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
