package apiserver

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/terrace-dev/terrace/internal/console"
	"github.com/terrace-dev/terrace/internal/testenv"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestConsoleOIDCSignInActsAsTheSignedInUser: the console's sign-in by the
// authorization code flow (PKCE) with an OpenID Connect provider ends with
// an ID token that a real kube-apiserver, trusting that provider through
// its structured authentication configuration, accepts: the API then acts
// as oidc:alice, whom RBAC refuses until a RoleBinding names her. A token
// for another audience, or not signed by the provider, is not accepted.
func TestConsoleOIDCSignInActsAsTheSignedInUser(t *testing.T) {
	oidc := &console.OIDC{IssuerURL: oidcProvider.URL, ClientID: oidcClientID, RedirectURL: "https://unset/oidc/callback", HTTPClient: oidcProvider.Client}
	at := newAPITestWith(t, func(s *Server) {
		web, err := console.Handler(console.Options{Namespace: s.Namespace, OIDC: oidc})
		if err != nil {
			t.Fatal(err)
		}
		s.Console = web
	})
	// The redirect URL is known once the server listens; it is read at the first sign-in.
	oidc.RedirectURL = at.url + "/oidc/callback"
	ctx := context.Background()
	api := at.grpcClient()
	if _, err := api.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
		t.Fatal(err)
	}

	idToken := oidcSignIn(t, at)
	user := testenv.OIDCUsernamePrefix + "alice"
	_, err := api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, idToken))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, `User "`+user+`"`)

	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "alice"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch"}},
	}}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "alice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "alice"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	listed, err := api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, idToken))
	if err != nil || len(listed.Msg.GetItems()) != 1 || listed.Msg.GetItems()[0].GetName() != "web" {
		t.Fatalf("ListAll as %s: %v %v", user, listed, err)
	}
	_, err = api.Suspend(ctx, withToken(&apiv1.SuspendRequest{Name: "web"}, idToken))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, `User "`+user+`" cannot patch`)

	otherAudience, err := oidcProvider.IDToken("someone-else", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, otherAudience))
	expectCode(t, err, connect.CodeUnauthenticated, reasonUnauthenticated)
	parts := strings.Split(idToken, ".")
	forged := parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2]))
	_, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, forged))
	expectCode(t, err, connect.CodeUnauthenticated, reasonUnauthenticated)
}

// oidcSignIn follows the console's sign-in from /oidc/login through the
// provider and back, as a browser would, and returns the ID token the
// page receives in the fragment.
func oidcSignIn(t *testing.T, at *apiTest) string {
	t.Helper()
	tr := at.http.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.RootCAs = tr.TLSClientConfig.RootCAs.Clone()
	tr.TLSClientConfig.RootCAs.AddCert(oidcProvider.Certificate())
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var last *url.URL
	browser := &http.Client{Transport: tr, Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(req *http.Request, _ []*http.Request) error { last = req.URL; return nil }}
	resp, err := browser.Get(at.url + "/oidc/login")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if last == nil || last.Path != "/" {
		t.Fatalf("the sign-in ended at %v", last)
	}
	fragment, err := url.ParseQuery(last.Fragment)
	if err != nil || fragment.Get("id_token") == "" {
		t.Fatalf("the sign-in ended with fragment %q (%v), want an ID token", last.Fragment, err)
	}
	return fragment.Get("id_token")
}
