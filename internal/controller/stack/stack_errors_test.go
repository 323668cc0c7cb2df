package stack

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/runner"
)

// liveSession is a runner that has not died; classify asks nothing else.
type liveSession struct{ runSession }

func (liveSession) Died() error { return nil }

func TestUndeclaredVariableIsATerminalConditionOfItsOwn(t *testing.T) {
	msg := `the Stack's vars/varsFrom set "false", which the module does not declare (it declares n): YAML reads an unquoted key n ...`
	err := classify(liveSession{}, runnerError(t, codes.InvalidArgument, runner.ReasonUndeclaredVariable, msg), PlanFailedReason, "plan failed")
	var terminal *reconcile.TerminalError
	if !errors.As(err, &terminal) || terminal.Reason != UndeclaredVariableReason || !strings.Contains(err.Error(), `"false"`) {
		t.Fatalf("classify = %#v, want a terminal %s error carrying the runner's message", err, UndeclaredVariableReason)
	}

	err = classify(liveSession{}, runnerError(t, codes.Unknown, runner.ReasonCommandFailed, "Error: Unsupported argument"), PlanFailedReason, "plan failed")
	if !errors.As(err, &terminal) || terminal.Reason != PlanFailedReason {
		t.Fatalf("an ordinary command failure became %v, want reason %s", err, PlanFailedReason)
	}
}
