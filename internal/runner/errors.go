package runner

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/tf"
)

// ErrorDomain and the reasons below are set as google.rpc.ErrorInfo on
// every error the runner returns, so the controller can tell them apart
// without parsing messages.
const (
	ErrorDomain = "runner.terrace.dev"

	// ReasonBusy: another operation is running (FailedPrecondition).
	ReasonBusy = "RUNNER_BUSY"
	// ReasonNotReady: no source, or Init not done (FailedPrecondition).
	ReasonNotReady = "NOT_READY"
	// ReasonCommandFailed: tofu exited with an error; the message is its
	// diagnostics (Unknown).
	ReasonCommandFailed = "COMMAND_FAILED"
	// ReasonInvalidArgument: a bad request (InvalidArgument).
	ReasonInvalidArgument = "INVALID_ARGUMENT"
	// ReasonUnsafeArchive: the archive was refused (InvalidArgument).
	ReasonUnsafeArchive = "UNSAFE_ARCHIVE"
	// ReasonDigestMismatch: the archive or plan is not the one expected (InvalidArgument).
	ReasonDigestMismatch = "DIGEST_MISMATCH"
	// ReasonTooLarge: the archive is over a limit (InvalidArgument).
	ReasonTooLarge = "TOO_LARGE"
	// ReasonPlanNotFound: no saved plan with that id (NotFound).
	ReasonPlanNotFound = "PLAN_NOT_FOUND"
	// ReasonFetchFailed: the source server refused or failed (NotFound for
	// 404/410, Unavailable otherwise).
	ReasonFetchFailed = "FETCH_FAILED"
	// ReasonInterrupted: the call was cancelled and tofu interrupted.
	ReasonInterrupted = "INTERRUPTED"
	// ReasonStateLocked: tofu could not take the state lock, which another
	// run holds (Aborted); it passes when that run ends.
	ReasonStateLocked = "STATE_LOCKED"
	// ReasonOutOfSpace: the runner's disk is full (ResourceExhausted).
	ReasonOutOfSpace = "OUT_OF_SPACE"
	// ReasonPlanStale: the saved plan was made from a state that has
	// changed since (FailedPrecondition); only a new plan can go on.
	ReasonPlanStale = "PLAN_STALE"
	// ReasonStateTooLarge: the state would be (or was) refused by the
	// state server as over its size limit (FailedPrecondition); the Stack
	// must change, or the limit.
	ReasonStateTooLarge = "STATE_TOO_LARGE"
	// ReasonStateUnavailable: tofu got no answer from the state server,
	// after its retries (Unavailable); it passes when the server (or the
	// database behind it) is back.
	ReasonStateUnavailable = "STATE_UNAVAILABLE"
	// ReasonUndeclaredVariable: the variables set a name the module does not
	// declare, and it matters: a YAML-boolean key, or tofu missed a required
	// value (InvalidArgument).
	ReasonUndeclaredVariable = "UNDECLARED_VARIABLE"
)

func statusError(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}); err == nil {
		st = withInfo
	}
	return st.Err()
}

func busyError(op string) error {
	return statusError(codes.FailedPrecondition, ReasonBusy, "runner is busy: another operation is running, "+op+" refused")
}

// toStatus maps an operation's error to a gRPC status. Messages are
// redacted: an error may quote tofu's diagnostics.
func (s *Server) toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	msg := s.exec.Redactor().String(err.Error())
	var cmdErr *tf.CommandError
	var mismatch *artifact.DigestMismatchError
	var fetchErr *artifact.FetchStatusError
	switch {
	case errors.Is(err, context.Canceled):
		return statusError(codes.Canceled, ReasonInterrupted, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return statusError(codes.DeadlineExceeded, ReasonInterrupted, msg)
	case errors.Is(err, tf.ErrUndeclaredVariable):
		return statusError(codes.InvalidArgument, ReasonUndeclaredVariable, msg)
	case errors.As(err, &cmdErr) && cmdErr.OutOfSpace():
		return statusError(codes.ResourceExhausted, ReasonOutOfSpace, msg)
	case errors.As(err, &cmdErr) && cmdErr.StateTooLarge():
		return statusError(codes.FailedPrecondition, ReasonStateTooLarge, msg)
	case errors.As(err, &cmdErr) && cmdErr.PlanStale():
		return statusError(codes.FailedPrecondition, ReasonPlanStale, msg)
	case errors.As(err, &cmdErr) && cmdErr.StateUnavailable():
		// Before StateLocked: a lock request that got no answer is no
		// conflict with another run.
		return statusError(codes.Unavailable, ReasonStateUnavailable, msg)
	case errors.As(err, &cmdErr) && cmdErr.StateLocked():
		return statusError(codes.Aborted, ReasonStateLocked, msg)
	case errors.As(err, &cmdErr):
		return statusError(codes.Unknown, ReasonCommandFailed, msg)
	case errors.Is(err, tf.ErrNotInitialized), errors.Is(err, tf.ErrNoSource):
		return statusError(codes.FailedPrecondition, ReasonNotReady, msg)
	case errors.Is(err, tf.ErrPlanNotFound):
		return statusError(codes.NotFound, ReasonPlanNotFound, msg)
	case errors.As(err, &mismatch):
		return statusError(codes.InvalidArgument, ReasonDigestMismatch, msg)
	case errors.Is(err, artifact.ErrLimitExceeded):
		return statusError(codes.InvalidArgument, ReasonTooLarge, msg)
	case errors.Is(err, artifact.ErrUnsafeEntry):
		return statusError(codes.InvalidArgument, ReasonUnsafeArchive, msg)
	case errors.As(err, &fetchErr):
		code := codes.Unavailable
		if fetchErr.StatusCode == http.StatusNotFound || fetchErr.StatusCode == http.StatusGone {
			code = codes.NotFound
		}
		return statusError(code, ReasonFetchFailed, msg)
	case errors.Is(err, artifact.ErrUnreachable):
		return statusError(codes.Unavailable, ReasonFetchFailed, msg)
	case errors.Is(err, tf.ErrInvalidArgument):
		return statusError(codes.InvalidArgument, ReasonInvalidArgument, msg)
	}
	return status.Error(codes.Internal, msg)
}

// Reason returns the ErrorInfo reason of an error returned by the runner
// (through the client), or "".
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
			return info.Reason
		}
	}
	return ""
}

// IsBusy reports whether the runner refused a call because another
// operation was running.
func IsBusy(err error) bool { return Reason(err) == ReasonBusy }
