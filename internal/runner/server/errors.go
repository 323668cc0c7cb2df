package server

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/tf"
)

func statusError(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: runner.ErrorDomain}); err == nil {
		st = withInfo
	}
	return st.Err()
}

func busyError(op string) error {
	return statusError(codes.FailedPrecondition, runner.ReasonBusy, "runner is busy: another operation is running, "+op+" refused")
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
		return statusError(codes.Canceled, runner.ReasonInterrupted, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return statusError(codes.DeadlineExceeded, runner.ReasonInterrupted, msg)
	case errors.Is(err, tf.ErrUndeclaredVariable):
		return statusError(codes.InvalidArgument, runner.ReasonUndeclaredVariable, msg)
	case errors.As(err, &cmdErr) && cmdErr.OutOfSpace():
		return statusError(codes.ResourceExhausted, runner.ReasonOutOfSpace, msg)
	case errors.As(err, &cmdErr) && cmdErr.StateTooLarge():
		return statusError(codes.FailedPrecondition, runner.ReasonStateTooLarge, msg)
	case errors.As(err, &cmdErr) && cmdErr.PlanStale():
		return statusError(codes.FailedPrecondition, runner.ReasonPlanStale, msg)
	case errors.As(err, &cmdErr) && cmdErr.StateUnavailable():
		// Before StateLocked: a lock request that got no answer is no
		// conflict with another run.
		return statusError(codes.Unavailable, runner.ReasonStateUnavailable, msg)
	case errors.As(err, &cmdErr) && cmdErr.StateLocked():
		return statusError(codes.Aborted, runner.ReasonStateLocked, msg)
	case errors.As(err, &cmdErr):
		return statusError(codes.Unknown, runner.ReasonCommandFailed, msg)
	case errors.Is(err, tf.ErrNotInitialized), errors.Is(err, tf.ErrNoSource):
		return statusError(codes.FailedPrecondition, runner.ReasonNotReady, msg)
	case errors.Is(err, tf.ErrPlanNotFound):
		return statusError(codes.NotFound, runner.ReasonPlanNotFound, msg)
	case errors.As(err, &mismatch):
		return statusError(codes.InvalidArgument, runner.ReasonDigestMismatch, msg)
	case errors.Is(err, artifact.ErrLimitExceeded):
		return statusError(codes.InvalidArgument, runner.ReasonTooLarge, msg)
	case errors.Is(err, artifact.ErrUnsafeEntry):
		return statusError(codes.InvalidArgument, runner.ReasonUnsafeArchive, msg)
	case errors.As(err, &fetchErr):
		code := codes.Unavailable
		if fetchErr.StatusCode == http.StatusNotFound || fetchErr.StatusCode == http.StatusGone {
			code = codes.NotFound
		}
		return statusError(code, runner.ReasonFetchFailed, msg)
	case errors.Is(err, artifact.ErrUnreachable):
		return statusError(codes.Unavailable, runner.ReasonFetchFailed, msg)
	case errors.Is(err, tf.ErrInvalidArgument):
		return statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, msg)
	}
	return status.Error(codes.Internal, msg)
}
