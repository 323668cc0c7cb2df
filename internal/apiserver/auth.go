package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"connectrpc.com/connect"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// caller is who a request's token belongs to, as the TokenReview said.
type caller struct {
	authenticationv1.UserInfo
}

// access is one permission a route needs in the server's namespace.
type access struct {
	verb     string
	group    string
	resource string
	// name is the object's name; "" for a collection or a create.
	name string
	// nameSuffix, for a secrets access on a named route, makes the Secret's
	// name the installation's name plus this suffix.
	nameSuffix string
}

// forName fills in the object name of an access on the named route.
func (a access) forName(installation string) access {
	if installation == "" {
		return a
	}
	switch {
	case a.resource == "stacks":
		a.name = installation
	case a.nameSuffix != "":
		a.name = installation + a.nameSuffix
	}
	return a
}

func (a access) String() string {
	what := a.resource
	if a.group != "" {
		what += "." + a.group
	}
	if a.name != "" {
		what += fmt.Sprintf(" %q", a.name)
	}
	return a.verb + " " + what
}

// authenticate checks the bearer token with a TokenReview.
func (s *Server) authenticate(ctx context.Context, header http.Header) (*caller, error) {
	scheme, token, found := strings.Cut(header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, unauthenticated("a bearer token is required: send 'Authorization: Bearer <token>' with a Kubernetes token (e.g. `kubectl create token <serviceaccount>`)")
	}
	review, err := s.Reviews.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: s.TokenAudiences},
	}, metav1.CreateOptions{})
	if err != nil {
		// The error comes from the API server and never holds the token.
		return nil, fmt.Errorf("failed to review a bearer token: %w", err)
	}
	if !review.Status.Authenticated {
		// status.error is not passed on: it may say more about the token than a stranger should learn.
		msg := "the bearer token was not accepted by the Kubernetes API server (expired, revoked or not a token of this cluster)"
		if len(s.TokenAudiences) > 0 {
			msg = fmt.Sprintf("the bearer token was not accepted by the Kubernetes API server (expired, revoked, not a token of this cluster, or not issued for the audience %q: e.g. `kubectl create token <serviceaccount> --audience %s`)", s.TokenAudiences[0], s.TokenAudiences[0])
		}
		return nil, unauthenticated(msg)
	}
	// An authenticator that ignores audiences answers without them; the
	// review is only good for this server if one of its audiences is ours.
	if len(s.TokenAudiences) > 0 && !slices.ContainsFunc(review.Status.Audiences, func(a string) bool { return slices.Contains(s.TokenAudiences, a) }) {
		return nil, unauthenticated(fmt.Sprintf("the bearer token is not for this server: ask for one with the audience %q (e.g. `kubectl create token <serviceaccount> --audience %s`)", s.TokenAudiences[0], s.TokenAudiences[0]))
	}
	return &caller{UserInfo: review.Status.User}, nil
}

// authorize asks a SubjectAccessReview whether the caller may do a in the
// server's namespace.
func (s *Server) authorize(ctx context.Context, c *caller, a access) error {
	extra := make(map[string]authorizationv1.ExtraValue, len(c.Extra))
	for k, v := range c.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	review, err := s.Reviews.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   c.Username,
			UID:    c.UID,
			Groups: c.Groups,
			Extra:  extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: s.Namespace,
				Verb:      a.verb,
				Group:     a.group,
				Resource:  a.resource,
				Name:      a.name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("failed to review the access of %s: %w", c.Username, err)
	}
	if review.Status.Allowed {
		return nil
	}
	message := fmt.Sprintf("%s may not %s in namespace %s", c.Username, a, s.Namespace)
	if reason := review.Status.Reason; reason != "" {
		message += ": " + reason
	}
	if review.Status.EvaluationError != "" {
		message += " (the authorizer reported an error; ask your cluster administrator)"
	}
	return forbidden(message)
}

// allowed is authorize for an optional extra: false when denied.
func (s *Server) allowed(ctx context.Context, c *caller, a access) (bool, error) {
	err := s.authorize(ctx, c, a)
	if cerr := (*connect.Error)(nil); errors.As(err, &cerr) && cerr.Code() == connect.CodePermissionDenied {
		return false, nil
	}
	return err == nil, err
}

func unauthenticated(message string) error {
	return failure(connect.CodeUnauthenticated, reasonUnauthenticated, message)
}
