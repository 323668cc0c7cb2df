package apiserver

import (
	"net/http"
	"strings"
	"testing"
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
