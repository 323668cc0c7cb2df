package runner

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
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
	// ReasonForgeFailed: the forge's API refused or failed a pull-request
	// call (PermissionDenied for credentials and permissions, NotFound,
	// InvalidArgument for a configuration that cannot work, Unavailable
	// otherwise).
	ReasonForgeFailed = "FORGE_FAILED"
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

// Reasons of a failed Clone (spec.source.git).
const (
	// ReasonGitRefNotFound: the repository, or the branch, tag, commit or
	// a tag in the semver range, does not exist (NotFound).
	ReasonGitRefNotFound = "GIT_REF_NOT_FOUND"
	// ReasonGitAuthFailed: the server refused the credentials, or asked
	// for some (PermissionDenied).
	ReasonGitAuthFailed = "GIT_AUTH_FAILED"
	// ReasonGitHostKeyUnknown: the ssh server's host key is not in the
	// Secret's known_hosts, or differs from it (FailedPrecondition).
	ReasonGitHostKeyUnknown = "GIT_HOST_KEY_UNKNOWN"
)

// ReasonNotClaimed: a warm runner was asked to work before a run claimed
// it, or to be claimed twice, or a runner started for one run was asked to
// be claimed (FailedPrecondition).
const ReasonNotClaimed = "NOT_CLAIMED"

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
