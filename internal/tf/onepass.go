package tf

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// ApplyInOneProcess plans and applies in one `tofu apply -auto-approve
// -json`, as direct `tofu apply` does: one process, one state lock, no
// plan file and no `show -json`. planned is called once the plan is
// complete and before anything is applied, with the plan's result (its
// summary as the stream counts it; no JSON). The result is the same one,
// also when the apply then fails; applied says the plan had changes, so
// tofu applied (or tried to apply) them.
//
// Two things a saved plan gives are not had here, and the caller decides
// they are not needed: planned values to check the state's size before
// applying, and the plan's sensitive values for the redactor, which knows
// the variables' (tofu's own UI masks the values it knows sensitive).
func (e *Executor) ApplyInOneProcess(ctx context.Context, opts PlanOptions, logf LogFunc, planned func(*PlanResult)) (res *PlanResult, applied bool, err error) {
	if opts.Destroy || opts.RefreshOnly {
		return nil, false, fmt.Errorf("%w: destroy and refresh-only plans are applied from a saved plan", ErrInvalidArgument)
	}
	if opts.PlanID == "" {
		return nil, false, fmt.Errorf("%w: a plan applied in one process needs a plan id", ErrInvalidArgument)
	}
	if _, err := e.planPath(opts.PlanID); err != nil {
		return nil, false, err
	}
	if e.moduleDir == "" {
		return nil, false, ErrNotInitialized
	}
	varFiles, cleanup, explain, err := e.commandVariables(opts.Variables)
	if err != nil {
		return nil, false, err
	}
	defer cleanup()
	stream := e.uiStreamTo(logf)
	result := func() *PlanResult {
		sum := stream.result()
		return &PlanResult{PlanID: opts.PlanID, HasChanges: sum.hasChanges(), Summary: sum}
	}
	stream.onPlanned = func() {
		if planned != nil {
			planned(result())
		}
	}
	runErr := e.runJSON(ctx, "apply", e.moduleDir, e.directEnv(), stream, logf, oneProcessArgs(opts, varFiles)...)
	if runErr == nil {
		stream.planDone() // a stream without apply messages
		res = result()
		return res, res.HasChanges, nil
	}
	if !stream.planned() {
		return nil, false, explain(runErr)
	}
	e.keepUnsavedState(opts.PlanID, runErr)
	res = result()
	return res, res.HasChanges, runErr
}

// oneProcessArgs are ApplyInOneProcess's command line.
func oneProcessArgs(opts PlanOptions, varFiles []string) []string {
	args := []string{"apply", "-auto-approve", "-input=false", "-no-color", "-json"}
	for _, f := range varFiles {
		args = append(args, "-var-file="+f)
	}
	for _, t := range opts.Targets {
		args = append(args, "-target="+t)
	}
	for _, a := range opts.Replace {
		args = append(args, "-replace="+a)
	}
	if opts.Parallelism > 0 {
		args = append(args, "-parallelism="+strconv.Itoa(opts.Parallelism))
	}
	if opts.SkipRefresh {
		args = append(args, "-refresh=false")
	}
	return args
}

// hasChanges says applying the plan would change anything, outputs
// included (as plan -detailed-exitcode counts).
func (s Summary) hasChanges() bool {
	return s.Add+s.Change+s.Destroy+s.Import+s.Forget+s.OutputChanges > 0
}

// applyPhase says a UI message belongs to the apply: the plan before it is
// complete, its outputs included.
func applyPhase(m *uiMessage) bool {
	if m.Type == "change_summary" {
		return m.Changes != nil && m.Changes.Operation == "apply"
	}
	return strings.HasPrefix(m.Type, "apply_") || strings.HasPrefix(m.Type, "provision_") ||
		(m.Type == "outputs" && !plannedOutputs(m.Outputs))
}
