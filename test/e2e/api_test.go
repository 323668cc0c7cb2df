package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
)

// TestInstallationsAPIOnTheDevCluster enables spec.api in a namespace's
// TerraceConfig: the controller runs `terrace api` as a Deployment (on the
// real node), and a tool with a ServiceAccount token creates an
// installation through it, which the controller applies.
func TestInstallationsAPIOnTheDevCluster(t *testing.T) {
	e := newStackEnv(t)
	// The API pod, Ready behind its HTTPS readiness probe.
	podIP := e.enableAPI(t)
	api := e.apiClient(t, podIP)

	// A tool's identity: a ServiceAccount allowed to manage Stacks here.
	token := e.toolToken(t, "deployer")
	api.do(t, token, http.MethodPost, "/v1/installations", map[string]any{
		"name": "web", "source": map[string]string{"programRef": "bench"},
		"values": map[string]any{"n": 7}, "approvePlan": terracev1.ApprovePlanAuto,
	}, http.StatusCreated, nil)
	e.waitStack(t, "web", stackTimeout, "the installation applied", readyAt)

	var got struct {
		Ready   bool  `json:"ready"`
		Release int64 `json:"release"`
	}
	api.do(t, token, http.MethodGet, "/v1/installations/web", nil, http.StatusOK, &got)
	if !got.Ready || got.Release != 1 {
		t.Errorf("installation: %+v", got)
	}
	var outs struct {
		Items []struct {
			Sensitive bool    `json:"sensitive"`
			Value     *string `json:"value"`
		} `json:"items"`
	}
	api.do(t, token, http.MethodGet, "/v1/installations/web/outputs", nil, http.StatusOK, &outs)
	// The output is built from the installation's values, which live in a
	// Secret: Terrace treats it as sensitive (tenancy: every value that came
	// from a Secret is masked), so a reader sees it masked.
	if len(outs.Items) != 1 || !outs.Items[0].Sensitive || outs.Items[0].Value != nil {
		t.Errorf("outputs: %+v, want one sensitive output, masked", outs)
	}
	// Without a token, and with one that has no rights here.
	api.do(t, "", http.MethodGet, "/v1/installations", nil, http.StatusUnauthorized, nil)
	api.do(t, e.toolTokenWithoutRights(t, "nobody"), http.MethodGet, "/v1/installations", nil, http.StatusForbidden, nil)
}

// toolToken returns a token of a new ServiceAccount bound to a Role in the
// test's namespace with the rights docs/api.md tells a tool's Role to
// grant: the API acts with them.
func (e *stackEnv) toolToken(t *testing.T, name string) string {
	t.Helper()
	token := e.toolTokenWithoutRights(t, name)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{terracev1.GroupVersion.Group}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
		},
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}},
	}
	for _, obj := range []client.Object{role, rb} {
		if err := e.c.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
	return token
}

func (e *stackEnv) toolTokenWithoutRights(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}
	if err := e.c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	tr, err := e.cs.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func ptrTo[T any](v T) *T { return &v }

// apiClient talks HTTPS to the API pod, trusting the CA its certificate
// Secret carries and checking the Service's name, as a tool in the cluster would.
type apiClient struct {
	base string
	http *http.Client
}

func (e *stackEnv) apiClient(t *testing.T, podIP string) *apiClient {
	t.Helper()
	https := e.apiHTTPClient(t)
	https.Timeout = 30 * time.Second
	return &apiClient{base: fmt.Sprintf("https://%s:%d", podIP, config.APIPort), http: https}
}

// do sends a request and decodes the answer into out, failing the test on
// another status than want.
func (c *apiClient) do(t *testing.T, token, method, path string, body any, want int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
}
