package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// The server acts as its caller: every Kubernetes request made for a call
// carries the call's own bearer token (pass-through), so the Kubernetes API
// authenticates it, its RBAC decides, and its audit log names the caller.
// Impersonation was the other way; it needs cluster-wide `impersonate`
// rights, which would make the server's own identity worth stealing.

// caller is who a call's token belongs to, as the Kubernetes API said.
type caller struct {
	authenticationv1.UserInfo
}

type callerTokenKey struct{}

// asCaller makes ctx carry the token that CallerClient sends.
func asCaller(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, callerTokenKey{}, token)
}

// errNoCaller is the answer of CallerClient to a request made outside a call.
var errNoCaller = errors.New("a request for a caller was made without the caller's token")

// callerTransport sets each request's bearer token from its context and
// refuses a request without one: nothing goes out with the server's own
// credentials through it.
type callerTransport struct{ next http.RoundTripper }

func (t *callerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, _ := req.Context().Value(callerTokenKey{}).(string)
	if token == "" {
		return nil, errNoCaller
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+token)
	return t.next.RoundTrip(req)
}

// CallerClient returns the client through which a Server acts as its
// callers: the API server's address and CA from cfg, and for credentials
// only the token of the call whose context a request is made with; cfg's
// own credentials are never used. The kinds it serves are known in advance
// (callerMapper), so it needs no discovery, which would have no caller.
func CallerClient(cfg *rest.Config, scheme *k8sruntime.Scheme) (client.WithWatch, error) {
	mapper := callerMapper()
	anonymous := rest.AnonymousClientConfig(cfg)
	httpClient, err := rest.HTTPClientFor(anonymous)
	if err != nil {
		return nil, fmt.Errorf("failed to create an HTTP client: %w", err)
	}
	httpClient.Transport = &callerTransport{next: httpClient.Transport}
	return client.NewWithWatch(anonymous, client.Options{HTTPClient: httpClient, Scheme: scheme, Mapper: mapper})
}

// callerMapper maps the kinds the server reads and writes for callers.
func callerMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	for _, kind := range []string{"Stack", "Program", "TerraceConfig"} {
		m.Add(terracev1.GroupVersion.WithKind(kind), meta.RESTScopeNamespace)
	}
	m.Add(corev1.SchemeGroupVersion.WithKind("Secret"), meta.RESTScopeNamespace)
	// Namespaces, for ListAll of a caller who may not list Stacks cluster-wide.
	m.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	m.Add(authenticationv1.SchemeGroupVersion.WithKind("SelfSubjectReview"), meta.RESTScopeRoot)
	m.Add(authorizationv1.SchemeGroupVersion.WithKind("SelfSubjectAccessReview"), meta.RESTScopeRoot)
	return m
}

// reviewTTL is how long who a token belongs to is remembered (by the
// token's hash): long enough to spare a review per call of a busy UI, short
// enough that a revoked token stops naming its user soon. Every request it
// makes is still checked by the Kubernetes API.
const (
	reviewTTL        = 10 * time.Second
	reviewCacheLimit = 4096
)

type reviewCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]reviewEntry
}

type reviewEntry struct {
	user    authenticationv1.UserInfo
	expires time.Time
}

func (c *reviewCache) get(key [sha256.Size]byte, now time.Time) (authenticationv1.UserInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || now.After(e.expires) {
		return authenticationv1.UserInfo{}, false
	}
	return e.user, true
}

func (c *reviewCache) put(key [sha256.Size]byte, user authenticationv1.UserInfo, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= reviewCacheLimit {
		// Dropping everything keeps the bound without bookkeeping; it only costs reviews.
		c.entries = map[[sha256.Size]byte]reviewEntry{}
	}
	c.entries[key] = reviewEntry{user: user, expires: now.Add(reviewTTL)}
}

// bearerToken is the call's bearer token.
func bearerToken(header http.Header) (string, error) {
	scheme, token, found := strings.Cut(header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", unauthenticated("a bearer token is required: send 'Authorization: Bearer <token>' with a Kubernetes token (e.g. `kubectl create token <serviceaccount>`)")
	}
	return token, nil
}

// authenticate asks the Kubernetes API of the call's site who the bearer
// token belongs to (a SelfSubjectReview made with the token) and returns
// ctx carrying the token.
func (s *Server) authenticate(ctx context.Context, token string, st *site) (*caller, context.Context, error) {
	ctx = asCaller(ctx, token)
	key := sha256.Sum256([]byte(st.Cluster + "\x00" + token))
	if user, ok := s.reviews.get(key, time.Now()); ok {
		return &caller{UserInfo: user}, ctx, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := st.Caller.Create(ctx, review); err != nil {
		if apierrors.IsUnauthorized(err) {
			return nil, ctx, unauthenticated("the bearer token was not accepted by the Kubernetes API server (expired, revoked or not a token of this cluster)")
		}
		// The error comes from the API server and never holds the token.
		return nil, ctx, fmt.Errorf("failed to ask who a bearer token belongs to: %w", err)
	}
	if len(s.TokenAudiences) > 0 && !hasAudience(token, s.TokenAudiences) {
		return nil, ctx, unauthenticated(fmt.Sprintf("the bearer token is not for this server: ask for one with the audience %q besides the Kubernetes API server's own (e.g. `kubectl create token <serviceaccount> --audience %s --audience <the API server's>`)", s.TokenAudiences[0], s.TokenAudiences[0]))
	}
	user := review.Status.UserInfo
	s.reviews.put(key, user, time.Now())
	return &caller{UserInfo: user}, ctx, nil
}

// hasAudience reports whether the token is a JWT one of whose audiences is
// wanted. Its claims are read unverified: the Kubernetes API has just
// accepted this exact token, so its signature is good.
func hasAudience(token string, wanted []string) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return false
	}
	var claims struct {
		Audience json.RawMessage `json:"aud"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return false
	}
	var audiences []string
	if json.Unmarshal(claims.Audience, &audiences) != nil {
		var one string
		if json.Unmarshal(claims.Audience, &one) != nil {
			return false
		}
		audiences = []string{one}
	}
	return slices.ContainsFunc(audiences, func(a string) bool { return slices.Contains(wanted, a) })
}

// allowed asks, with the caller's own token, whether the caller may do verb
// on resource in the server's namespace: for an optional extra that is
// withheld rather than refused.
func (s *site) allowed(ctx context.Context, verb, resource string) (bool, error) {
	return s.allowedTo(ctx, authorizationv1.ResourceAttributes{Namespace: s.Namespace, Verb: verb, Resource: resource})
}

// allowedTo asks, with the caller's own token, whether the caller may do
// what attrs say.
func (s *site) allowedTo(ctx context.Context, attrs authorizationv1.ResourceAttributes) (bool, error) {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
	if err := s.Caller.Create(ctx, review); err != nil {
		return false, fmt.Errorf("failed to review the caller's access: %w", err)
	}
	return review.Status.Allowed, nil
}

func unauthenticated(message string) error {
	return failure(connect.CodeUnauthenticated, reasonUnauthenticated, message)
}
