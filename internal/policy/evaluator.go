package policy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/util"
)

// A tenant's policy can allocate without bound in one builtin call
// (numbers.range(1, 30000000) grew the controller's heap by 1,142 MiB),
// and OPA has no memory limit; its cancellation is checked between steps,
// not inside a builtin. So every evaluation runs in a child process of this
// same binary, which lowers its own RLIMIT_DATA before it reads a byte of
// the policies: the kernel then refuses the child's heap more than its
// bound (evalMemory), whatever the policy does (builtins, comprehensions,
// strings built by doubling), and the child ends instead of the
// controller. The parent also kills the child at the deadline, which
// in-process cancellation could not do inside a builtin call, and keeps
// only a bounded answer.
const (
	// maxConcurrentEvaluations bounds how many evaluator processes run at
	// once; others wait for a slot.
	maxConcurrentEvaluations = 2
	// maxAnswerBytes bounds the decision read back (the rules' messages).
	maxAnswerBytes = 4 << 20
	// killGrace is how long after EvalTimeout a child still running (in a
	// builtin call that does not see the cancellation) is killed.
	killGrace = 2 * time.Second
)

// The child is this binary started with evaluatorArg and evaluatorEnv set:
// the package's init then serves one evaluation and exits, before main or
// TestMain, so every binary that links this package (the terrace binary,
// each test binary that runs the controller) can be the evaluator with no
// hook of its own.
const (
	evaluatorArg       = "terrace-policy-evaluator"
	evaluatorEnv       = "TERRACE_POLICY_EVALUATOR"
	evaluatorMemoryEnv = "TERRACE_POLICY_EVALUATOR_MEMORY"
	// evaluatorSetupFailed is the evaluator's exit code when it could not
	// bound itself or write its answer (the Go runtime's own is 2).
	evaluatorSetupFailed = 3
)

func init() {
	if os.Getenv(evaluatorEnv) != "1" || len(os.Args) != 2 || os.Args[1] != evaluatorArg {
		return
	}
	os.Exit(serveEvaluation(os.Stdin, os.Stdout))
}

// evaluationSlots holds one token per running evaluator process.
var evaluationSlots = make(chan struct{}, maxConcurrentEvaluations)

// evaluatorsMemory is shared by the evaluator processes running at once.
var evaluatorsMemory = newMemoryBudget(MaxEvalMemory)

// request is what the parent sends first, one JSON line; the plan JSON
// follows it to the end of the input.
type request struct {
	Modules []Module `json:"modules"`
}

// answer is what the child writes.
type answer struct {
	Violations []string `json:"violations,omitempty"`
	Warnings   []string `json:"warnings,omitempty"`
	// Error is a failed evaluation (a builtin error, the deadline, a
	// request that does not read).
	Error string `json:"error,omitempty"`
}

// ResourceError says an evaluation was stopped at a limit.
type ResourceError struct {
	// Limit names it: "memory" or "time".
	Limit string
	// Memory is the evaluation's memory bound, PlanBytes the plan JSON's
	// size it was computed from.
	Memory, PlanBytes int64
	// PeakRSS is the evaluator process's largest resident set, when known.
	PeakRSS int64
	// Detail is how the evaluator process ended, when it ended itself.
	Detail string
}

func (e *ResourceError) Error() string {
	if e.Limit == "time" {
		return fmt.Sprintf("the plan policies did not decide within %s and were stopped: make them do less work per plan", EvalTimeout)
	}
	msg := fmt.Sprintf("the plan policies needed more than %d MiB of memory (for a plan JSON of %s) and were stopped: ", e.Memory>>20, byteSize(e.PlanBytes))
	if e.Memory >= MaxEvalMemory {
		msg += "the plan is too large to check within the policies' memory, split the Stack"
	} else {
		msg += "make them build smaller values (numbers.range, comprehensions, strings) per plan"
	}
	if e.Detail != "" {
		msg += " (the evaluator ended with: " + e.Detail + ")"
	}
	return msg
}

// Evaluate checks one plan's JSON in an evaluator process. An error means
// no decision (a policy that fails at run time, ran out of time or memory):
// callers must not apply.
func (s *Set) Evaluate(ctx context.Context, planJSON []byte) (Decision, error) {
	select {
	case evaluationSlots <- struct{}{}:
		defer func() { <-evaluationSlots }()
	case <-ctx.Done():
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: %w", ctx.Err())
	}
	memory := evalMemory(int64(len(planJSON)))
	if err := evaluatorsMemory.acquire(ctx, memory); err != nil {
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: %w", err)
	}
	defer evaluatorsMemory.release(memory)
	self, err := os.Executable()
	if err != nil {
		return Decision{}, fmt.Errorf("failed to find the policy evaluator: %w", err)
	}
	header, err := json.Marshal(request{Modules: s.modules})
	if err != nil {
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, EvalTimeout+killGrace)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, evaluatorArg)
	cmd.Env = []string{
		evaluatorEnv + "=1",
		evaluatorMemoryEnv + "=" + strconv.FormatInt(memory, 10),
		"GOMAXPROCS=1",
		"GOTRACEBACK=none",
	}
	cmd.SysProcAttr = evaluatorProcAttr()
	cmd.Stdin = io.MultiReader(bytes.NewReader(header), strings.NewReader("\n"), bytes.NewReader(planJSON))
	stdout := &boundedBuffer{max: maxAnswerBytes}
	stderr := &headBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	peak := peakRSS(cmd.ProcessState)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return Decision{}, &ResourceError{Limit: "time", Memory: memory, PlanBytes: int64(len(planJSON)), PeakRSS: peak}
	case ctx.Err() != nil:
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: %w", ctx.Err())
	case cmd.ProcessState == nil:
		return Decision{}, fmt.Errorf("failed to start the policy evaluator: %w", runErr)
	case cmd.ProcessState.ExitCode() == evaluatorSetupFailed:
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: the evaluator could not start: %s", firstLine(stderr.String()))
	case stdout.over:
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: their messages are over %d MiB", maxAnswerBytes>>20)
	case runErr != nil:
		// The evaluator answers whatever the policy does; it ends without
		// an answer only when the kernel refuses it memory, and Go's
		// runtime then ends it in more than one way (a fatal "out of
		// memory" or "cannot allocate memory", or a fault in the runtime
		// itself).
		return Decision{}, &ResourceError{Limit: "memory", Memory: memory, PlanBytes: int64(len(planJSON)), PeakRSS: peak, Detail: firstLine(stderr.String())}
	}
	var a answer
	if err := json.Unmarshal(stdout.Bytes(), &a); err != nil {
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: the evaluator's answer does not read: %w", err)
	}
	if a.Error != "" {
		return Decision{}, fmt.Errorf("failed to evaluate the plan policies: %s", a.Error)
	}
	return Decision{Violations: a.Violations, Warnings: a.Warnings}, nil
}

// serveEvaluation is the evaluator process: bound its own memory, read the
// modules and the plan, evaluate, write the answer. Its exit code is 0
// whenever an answer was written.
func serveEvaluation(in io.Reader, out io.Writer) int {
	limit, err := strconv.ParseInt(os.Getenv(evaluatorMemoryEnv), 10, 64)
	if err != nil || limit <= 0 {
		fmt.Fprintln(os.Stderr, "policy evaluator: no memory limit given")
		return evaluatorSetupFailed
	}
	if err := limitMemory(limit); err != nil {
		fmt.Fprintln(os.Stderr, "policy evaluator:", err)
		return evaluatorSetupFailed
	}
	// The collector works harder as the heap nears the bound, so garbage
	// alone does not end a legitimate evaluation.
	debug.SetMemoryLimit(limit * 3 / 4)
	a := evaluate(in)
	if err := json.NewEncoder(out).Encode(a); err != nil {
		fmt.Fprintln(os.Stderr, "policy evaluator:", err)
		return evaluatorSetupFailed
	}
	return 0
}

func evaluate(in io.Reader) answer {
	r := bufio.NewReader(in)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return answer{Error: "the evaluator got no request"}
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return answer{Error: "the evaluator's request does not read: " + err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), EvalTimeout)
	defer cancel()
	query, err := prepare(ctx, req.Modules)
	if err != nil {
		return answer{Error: err.Error()}
	}
	input, err := readInput(r)
	if err != nil {
		return answer{Error: fmt.Sprintf("failed to read the plan JSON: %v", err)}
	}
	rs, err := query.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return answer{Error: err.Error()}
	}
	var doc map[string]any
	if len(rs) > 0 && len(rs[0].Expressions) > 0 {
		doc, _ = rs[0].Expressions[0].Value.(map[string]any)
	}
	return answer{Violations: messages(doc["deny"]), Warnings: messages(doc["warn"])}
}

// readInput decodes the plan JSON into the value OPA evaluates, dropping
// the decoded Go values before the evaluation starts: the two together
// are the evaluator's largest use of memory for a large plan.
func readInput(r io.Reader) (ast.Value, error) {
	var decoded any
	if err := util.NewJSONDecoder(r).Decode(&decoded); err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(decoded)
}

// boundedBuffer keeps up to max bytes and refuses more.
type boundedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		b.over = true
		return 0, errors.New("answer too large")
	}
	return b.Buffer.Write(p)
}

// headBuffer keeps the first max bytes written: a fatal error's reason
// comes first, its goroutine dump after.
type headBuffer struct {
	buf []byte
	max int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *headBuffer) String() string { return string(b.buf) }

func byteSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}
