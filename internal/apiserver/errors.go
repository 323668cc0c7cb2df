package apiserver

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// errorDomain is the ErrorInfo domain of every error the API returns.
const errorDomain = "terrace.dev"

// The ErrorInfo reasons, for programs to switch on (listed in the proto).
const (
	reasonNotAnInstallation  = "NOT_AN_INSTALLATION"
	reasonNotFound           = "NOT_FOUND"
	reasonAlreadyExists      = "ALREADY_EXISTS"
	reasonForeignSecret      = "FOREIGN_SECRET"
	reasonInvalidInput       = "INVALID_INPUT"
	reasonForbidden          = "FORBIDDEN"
	reasonUnauthenticated    = "UNAUTHENTICATED"
	reasonPlanNotPending     = "PLAN_NOT_PENDING"
	reasonNoPlan             = "NO_PLAN"
	reasonChanged            = "CHANGED"
	reasonUnknownCluster     = "UNKNOWN_CLUSTER"
	reasonStoreMisconfigured = "STORE_MISCONFIGURED"
)

// failure is an error the caller sees: a code, a message saying what to do,
// and an ErrorInfo with the reason.
func failure(code connect.Code, reason, message string) *connect.Error {
	err := connect.NewError(code, errors.New(message))
	if detail, detailErr := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}); detailErr == nil {
		err.AddDetail(detail)
	}
	return err
}

func invalid(message string) error {
	return failure(connect.CodeInvalidArgument, reasonInvalidInput, message)
}
func notFound(message string) error { return failure(connect.CodeNotFound, reasonNotFound, message) }
func forbidden(message string) error {
	return failure(connect.CodePermissionDenied, reasonForbidden, message)
}

// reasonOf returns the ErrorInfo reason of an API error, "" for none.
func reasonOf(err error) string {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return ""
	}
	for _, d := range cerr.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.Reason
			}
		}
	}
	return ""
}

// kubeError turns an error of the Kubernetes API into the caller's answer.
// Messages of refused input are passed on: they name the field and the rule.
func kubeError(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return notFound(what + " not found")
	case apierrors.IsAlreadyExists(err):
		return failure(connect.CodeAlreadyExists, reasonAlreadyExists, what+" already exists")
	case apierrors.IsConflict(err):
		return failure(connect.CodeAborted, reasonChanged, what+" changed while this request ran: read it again and retry")
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return invalid(err.Error())
	case apierrors.IsForbidden(err):
		// The caller's own rights decided; the API server's message names
		// the user, the verb and the resource.
		return forbidden(err.Error())
	case apierrors.IsUnauthorized(err):
		return unauthenticated("the bearer token was not accepted by the Kubernetes API server (expired, revoked or not a token of this cluster)")
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return failure(connect.CodeDeadlineExceeded, reasonChanged, what+": the Kubernetes API server timed out: retry")
	}
	return fmt.Errorf("failed to access %s: %w", what, err)
}
