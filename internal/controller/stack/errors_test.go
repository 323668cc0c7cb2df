package stack

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
)

// liveSession is a runner that has not died; classify asks nothing else.
type liveSession struct{ runSession }

func (liveSession) Died() error { return nil }

func TestUndeclaredVariableIsATerminalConditionOfItsOwn(t *testing.T) {
	msg := `the Stack's vars/varsFrom set "false", which the module does not declare (it declares n): YAML reads an unquoted key n ...`
	err := classify(liveSession{}, runnerError(t, codes.InvalidArgument, runner.ReasonUndeclaredVariable, msg), PlanFailedReason, "plan failed")
	var terminal *outcome.TerminalError
	if !errors.As(err, &terminal) || terminal.Reason != UndeclaredVariableReason || !strings.Contains(err.Error(), `"false"`) {
		t.Fatalf("classify = %#v, want a terminal %s error carrying the runner's message", err, UndeclaredVariableReason)
	}

	err = classify(liveSession{}, runnerError(t, codes.Unknown, runner.ReasonCommandFailed, "Error: Unsupported argument"), PlanFailedReason, "plan failed")
	if !errors.As(err, &terminal) || terminal.Reason != PlanFailedReason {
		t.Fatalf("an ordinary command failure became %v, want reason %s", err, PlanFailedReason)
	}
}

// The runner's ErrorInfo reason, never the message, decides whether a
// failed call is terminal (the user must change something) or passes.
func TestClassifyFollowsTheRunnersReason(t *testing.T) {
	cases := []struct {
		name     string
		err      error
		terminal bool
	}{
		{"command failed", runnerError(t, codes.Unknown, runner.ReasonCommandFailed, "Error: Invalid reference"), true},
		{"invalid argument", runnerError(t, codes.InvalidArgument, runner.ReasonInvalidArgument, "plan id must be letters"), true},
		{"state locked", runnerError(t, codes.Aborted, runner.ReasonStateLocked, "Error acquiring the state lock"), false},
		{"a module whose message mentions the state lock", runnerError(t, codes.Unknown, runner.ReasonCommandFailed, `Error: output "state lock" is invalid`), true},
		{"busy", runnerError(t, codes.FailedPrecondition, runner.ReasonBusy, "runner is busy"), false},
		{"state server down", runnerError(t, codes.Unavailable, runner.ReasonStateUnavailable, "Failed to get state: GET https://x/state giving up after 5 attempt(s)"), false},
		{"disk full", runnerError(t, codes.ResourceExhausted, runner.ReasonOutOfSpace, "no space left on device"), false},
		{"interrupted", runnerError(t, codes.Canceled, runner.ReasonInterrupted, "interrupted"), false},
		{"no answer", status.Error(codes.Unavailable, "connection refused"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := classify(liveSession{}, tc.err, PlanFailedReason, "plan failed")
			var terminal *outcome.TerminalError
			if got := errors.As(err, &terminal); got != tc.terminal {
				t.Fatalf("classify(%v) terminal = %v, want %v", tc.err, got, tc.terminal)
			}
		})
	}
	died := classify(deadSession{}, runnerError(t, codes.Unknown, runner.ReasonCommandFailed, "signal: killed"), PlanFailedReason, "plan failed")
	var terminal *outcome.TerminalError
	if errors.As(died, &terminal) || !strings.Contains(died.Error(), "the runner died") {
		t.Fatalf("a runner that died: %v, want a transient error saying so", died)
	}
}

type deadSession struct{ runSession }

func (deadSession) Died() error { return errors.New("OOMKilled") }
