package apiserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
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

	// The Kubernetes API refuses the caller itself: its message names them.
	who := `User "system:serviceaccount:` + at.namespace + `:nobody"`
	at.expectError(http.StatusForbidden, at.nobody, http.MethodGet, "/v1/installations", nil,
		who+` cannot list resource "stacks" in API group "terrace.dev" in the namespace "`+at.namespace+`"`)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodGet, "/v1/installations/web", nil, `stacks.terrace.dev "web" is forbidden`, `cannot get resource "stacks"`)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodPost, "/v1/installations", validCreate("web"), `cannot create resource "stacks"`)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodPost, "/v1/installations/web/approve", map[string]string{"planId": "plan-1-a"}, `cannot get resource "stacks"`)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodDelete, "/v1/installations/web", nil, `cannot get resource "stacks"`)
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
	at.expectError(http.StatusForbidden, reader, http.MethodGet, "/v1/installations/web/outputs", nil, `secrets "web-outputs" is forbidden`, `cannot get resource "secrets"`)
	at.expectError(http.StatusForbidden, reader, http.MethodGet, "/v1/installations/web/releases", nil, `cannot list resource "secrets"`)
	at.expectError(http.StatusForbidden, creator, http.MethodPost, "/v1/installations", validCreate("db"), `cannot create resource "secrets"`)
}

func TestBodiesAreBounded(t *testing.T) {
	at := newAPITest(t)
	huge := `{"name":"web","values":{"blob":"` + strings.Repeat("x", maxBodyBytes) + `"}}`
	at.expectError(http.StatusRequestEntityTooLarge, at.admin, http.MethodPost, "/v1/installations", huge, "larger than")
}

// TestTokenAudiences: a server that asks for its own audience refuses a
// token issued only for the Kubernetes API server (which any workload
// holding a mounted token has), and accepts one issued for both: the
// Kubernetes API must accept every token, since the server passes it on.
func TestTokenAudiences(t *testing.T) {
	const audience = "terrace-api.example"
	at := newAPITestWith(t, func(s *Server) { s.TokenAudiences = []string{audience} })
	clientset := mustClientset(t)
	kubeAudience := tokenAudiences(t, at.admin)[0]

	// at.admin is a token for the API server's default audience.
	at.expectError(http.StatusUnauthorized, at.admin, http.MethodGet, "/v1/installations", nil, "not for this server", `audience "`+audience+`"`)
	other := audienceToken(t, clientset, at.namespace, "installer", "some-other-service")
	at.expectError(http.StatusUnauthorized, other, http.MethodGet, "/v1/installations", nil, "was not accepted")

	ours := audienceToken(t, clientset, at.namespace, "installer", kubeAudience, audience)
	at.expect(http.StatusOK, ours, http.MethodGet, "/v1/installations", nil, nil)
	// The audience decides who the caller is, not what they may do.
	nobody := audienceToken(t, clientset, at.namespace, "nobody", kubeAudience, audience)
	at.expectError(http.StatusForbidden, nobody, http.MethodGet, "/v1/installations", nil, `cannot list resource "stacks"`)

	// A server without audiences takes the default-audience token.
	plain := newAPITest(t)
	plain.expect(http.StatusOK, plain.admin, http.MethodGet, "/v1/installations", nil, nil)
}

// tokenAudiences reads a JWT's aud claim (unverified: the test made it).
func tokenAudiences(t *testing.T, token string) []string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Aud []string `json:"aud"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || len(claims.Aud) == 0 {
		t.Fatalf("aud claim: %v %s", err, payload)
	}
	return claims.Aud
}

// audienceToken returns a token of an existing ServiceAccount issued for audiences.
func audienceToken(t *testing.T, cs kubernetes.Interface, ns, sa string, audiences ...string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
