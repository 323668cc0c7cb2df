package stack

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
)

// UndeclaredVariableReason: spec.vars or spec.varsFrom set a variable the
// module does not declare, and that is why the run failed (a YAML-boolean
// key such as "false" from an unquoted n, or a misspelt required variable).
const UndeclaredVariableReason = "UndeclaredVariable"

// classify turns a runner call's error into terminal (the module or its
// inputs are wrong: the user must change something) or transient (the
// runner died, the state is locked, the network failed: retry with
// backoff). The runner's ErrorInfo reason decides, never the message.
func classify(sess runSession, err error, reason, what string) error {
	if died := sess.Died(); died != nil {
		return fmt.Errorf("%s: the runner died: %w", what, died)
	}
	switch runner.Reason(err) {
	case runner.ReasonUndeclaredVariable:
		return outcome.Terminalf(UndeclaredVariableReason, "%s: %s", what, runnerMessage(err))
	case runner.ReasonCommandFailed, runner.ReasonInvalidArgument, runner.ReasonDigestMismatch,
		runner.ReasonUnsafeArchive, runner.ReasonTooLarge:
		return outcome.Terminalf(reason, "%s: %s", what, runnerMessage(err))
	case runner.ReasonStateTooLarge:
		return outcome.Terminalf(StateTooLargeReason, "%s: %s", what, runnerMessage(err))
	case runner.ReasonStateLocked:
		return &stateLockedError{what: what, message: runnerMessage(err)}
	case runner.ReasonStateUnavailable:
		// The state server or its database restarting: retried with backoff.
		return fmt.Errorf("%s: the state server did not answer, retrying: %s", what, runnerMessage(err))
	}
	// Busy, not ready, interrupted, or no answer at all: it passes.
	return fmt.Errorf("%s: %w", what, err)
}

// classifySourceError gives each way a source can fail its own reason.
// Messages come from errors that never quote a server's answer; a refused
// or broken archive is terminal (the source must change), an unavailable
// source is looked at again after spec.retryInterval.
func classifySourceError(s *scope, err error) error {
	var terminal *outcome.TerminalError
	if errors.As(err, &terminal) {
		return err
	}
	if s.source.origin == fromGit {
		if gitErr, ok := classifyGitError(s, err); ok {
			return gitErr
		}
	}
	desc := s.source.description
	var notAllowed *artifact.HostNotAllowedError
	var refused *artifact.FetchStatusError
	switch {
	case errors.As(err, &notAllowed):
		return outcome.Terminalf(SourceHostNotAllowedReason, "%s: %s; the operator may add it with the controller flag --source-artifact-hosts", desc, notAllowed.Error())
	case errors.As(err, &refused):
		return outcome.Waiting(SourceUnavailableReason, retryBackoff(s.stack, 1), fmt.Errorf("%s is unavailable: %s", desc, refused.Error()))
	case errors.Is(err, artifact.ErrLimitExceeded):
		return outcome.Terminalf(SourceTooLargeReason, "%s is too large: %s", desc, runnerMessage(err))
	case errors.Is(err, artifact.ErrUnreachable):
		return outcome.Waiting(SourceUnavailableReason, retryBackoff(s.stack, 1), fmt.Errorf("%s is unavailable: %s", desc, runnerMessage(err)))
	}
	msg := runnerMessage(err)
	switch runner.Reason(err) {
	case runner.ReasonDigestMismatch:
		return outcome.Terminalf(SourceDigestMismatchReason, "%s: %s; fix the digest, or the tarball it names", desc, msg)
	case runner.ReasonUnsafeArchive:
		return outcome.Terminalf(SourceUnsafeReason, "%s was refused by the runner: %s", desc, msg)
	case runner.ReasonTooLarge:
		return outcome.Terminalf(SourceTooLargeReason, "%s is too large for the runner: %s", desc, msg)
	case runner.ReasonFetchFailed:
		return outcome.Waiting(SourceUnavailableReason, retryBackoff(s.stack, 1), fmt.Errorf("%s is unavailable to the runner: %s", desc, msg))
	case runner.ReasonInvalidArgument:
		return outcome.Terminalf(SourceInvalidReason, "%s cannot be loaded: %s", desc, msg)
	}
	return fmt.Errorf("failed to load %s into the runner: %w", desc, err)
}

// stateLockedError is a run that could not take the state lock: it passes
// (a retry with backoff), and for a Stack's own backend, whose locks
// Terrace never releases, status.backendLock shows it.
type stateLockedError struct {
	what    string
	message string
}

func (e *stateLockedError) Error() string {
	return fmt.Sprintf("%s: the state is locked: %s", e.what, e.message)
}

// runnerMessage is the message of a runner's gRPC status, or of err.
func runnerMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}
