package tf

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/terraform-exec/tfexec"
)

// PlanOptions are the inputs of Plan.
type PlanOptions struct {
	Variables   Variables
	Destroy     bool
	RefreshOnly bool
	Targets     []string
	// PlanID names the plan; empty derives one from the plan file's digest.
	PlanID string
	// Parallelism passes -parallelism when positive.
	Parallelism int
	// SkipRefresh passes -refresh=false.
	SkipRefresh bool
	// Replace passes -replace for each address.
	Replace []string
	// NoLock passes -lock=false: a pull request's plan-only run may read
	// the state, never lock it.
	NoLock bool
}

// PlanResult is a saved plan and what it would do.
type PlanResult struct {
	PlanID     string
	HasChanges bool
	Summary    Summary
	// JSON is the redacted `show -json` of the plan.
	JSON []byte
	// PlanFileSize is the size of the saved binary plan.
	PlanFileSize int64
	// PlannedStateBytes is the size of the plan's planned_values: a lower
	// bound of the state the apply saves (see PlannedStateBytes).
	PlannedStateBytes int64
}

// Plan runs plan -out into the work dir and reads the saved plan back.
func (e *Executor) Plan(ctx context.Context, opts PlanOptions, logf LogFunc) (*PlanResult, error) {
	if opts.Destroy && opts.RefreshOnly {
		return nil, fmt.Errorf("%w: destroy and refresh-only plans exclude each other", ErrInvalidArgument)
	}
	tf, flush, err := e.moduleCommand(logf)
	if err != nil {
		return nil, err
	}
	out := ""
	if opts.PlanID != "" {
		if out, err = e.planPath(opts.PlanID); err != nil {
			return nil, err
		}
	} else {
		suffix := make([]byte, 8)
		if _, err := rand.Read(suffix); err != nil {
			return nil, fmt.Errorf("failed to name the plan: %w", err)
		}
		out = filepath.Join(e.cfg.WorkDir, "plans", "pending-"+hex.EncodeToString(suffix)+".tfplan")
	}
	varFiles, cleanup, explain, err := e.commandVariables(opts.Variables)
	if err != nil {
		return nil, err
	}
	defer cleanup()

	planOpts := planFlags(opts, out, varFiles)
	// The -json stream gives the summary as tofu counts it; its messages
	// reach the log as the lines a person reads.
	stream := e.uiStreamTo(logf)
	hasChanges, err := tf.PlanJSON(ctx, stream, planOpts...)
	stream.Flush()
	flush()
	if err != nil {
		_ = os.Remove(out)
		if diags := stream.errorText(); diags != "" && ctx.Err() == nil {
			err = errors.New(diags)
		}
		return nil, explain(e.commandError("plan", ctx, err))
	}
	id := opts.PlanID
	if id == "" {
		digest, err := fileDigest(out)
		if err != nil {
			return nil, err
		}
		id = "plan-" + strings.TrimPrefix(digest, "sha256:")[:16]
		final, _ := e.planPath(id)
		if err := os.Rename(out, final); err != nil {
			return nil, fmt.Errorf("failed to store the plan: %w", err)
		}
		out = final
	}
	// One `show -json`: the plan's JSON for the caller, and what teaches
	// the redactor the plan's sensitive values before anything applies it.
	redacted, err := e.learnPlan(ctx, out)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return nil, fmt.Errorf("failed to read the plan file: %w", err)
	}
	return &PlanResult{PlanID: id, HasChanges: hasChanges, Summary: stream.result(), JSON: redacted, PlanFileSize: fi.Size(), PlannedStateBytes: PlannedStateBytes(redacted)}, nil
}

func logIfSet(logf LogFunc, stream Stream, line string) {
	if logf != nil {
		logf(stream, line)
	}
}

func (e *Executor) extraSensitiveNames() []string {
	names := make([]string, 0, len(e.extraSensitive))
	for n := range e.extraSensitive {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// showPlanJSON returns the raw, unredacted `show -json` of a plan file. It
// must never leave the package unredacted.
func (e *Executor) showPlanJSON(ctx context.Context, path string) ([]byte, error) {
	tf, _, err := e.moduleCommand(nil)
	if err != nil {
		return nil, err
	}
	// terraform-exec copies every command's stdout to SetStdout's writer,
	// its own version check included: make sure the version is cached
	// (asked once per executor), then capture.
	if _, err := e.version(ctx, e.moduleDir); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tf.SetStdout(&buf)
	if _, err := tf.ShowPlanFile(ctx, path, tfexec.JSONNumber(true)); err != nil {
		return nil, e.commandError("show", ctx, err)
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

// learnPlan teaches the redactor every sensitive value in a saved plan, so
// a runner that received the plan file (UploadPlan) redacts like the one
// that made it.
func (e *Executor) learnPlan(ctx context.Context, path string) ([]byte, error) {
	raw, err := e.showPlanJSON(ctx, path)
	if err != nil {
		return nil, err
	}
	redacted, err := e.redactor.RedactPlanJSON(raw, e.extraSensitiveNames())
	if err != nil {
		return nil, fmt.Errorf("failed to redact the plan: %w", err)
	}
	if digest, err := fileDigest(path); err == nil {
		e.learned[path] = digest
	}
	return redacted, nil
}

// knowsPlan says the redactor learnt the plan file at path as it is now.
func (e *Executor) knowsPlan(path string) bool {
	known, ok := e.learned[path]
	if !ok {
		return false
	}
	digest, err := fileDigest(path)
	return err == nil && digest == known
}

// ShowPlanJSON returns a saved plan's JSON, redacted.
func (e *Executor) ShowPlanJSON(ctx context.Context, planID string) ([]byte, error) {
	path, err := e.existingPlanPath(planID)
	if err != nil {
		return nil, err
	}
	return e.learnPlan(ctx, path)
}

// ShowPlanHuman returns a saved plan as tofu prints it, redacted.
func (e *Executor) ShowPlanHuman(ctx context.Context, planID string) ([]byte, error) {
	path, err := e.existingPlanPath(planID)
	if err != nil {
		return nil, err
	}
	if _, err := e.learnPlan(ctx, path); err != nil {
		return nil, err
	}
	tf, _, err := e.moduleCommand(nil)
	if err != nil {
		return nil, err
	}
	text, err := tf.ShowPlanFileRaw(ctx, path)
	if err != nil {
		return nil, e.commandError("show", ctx, err)
	}
	return []byte(e.redactor.String(text)), nil
}

// Apply applies exactly the saved plan planID.
func (e *Executor) Apply(ctx context.Context, planID string, logf LogFunc) error {
	return e.ApplyWith(ctx, ApplyOptions{PlanID: planID}, logf)
}

// ApplyWith applies exactly the saved plan opts.PlanID.
func (e *Executor) ApplyWith(ctx context.Context, opts ApplyOptions, logf LogFunc) error {
	planID := opts.PlanID
	path, err := e.existingPlanPath(planID)
	if err != nil {
		return err
	}
	// A plan made (or shown) here is known; one received from the
	// controller is learnt first.
	if !e.knowsPlan(path) {
		if _, err := e.learnPlan(ctx, path); err != nil {
			return err
		}
	}
	tf, flush, err := e.moduleCommand(logf)
	if err != nil {
		return err
	}
	applyOpts := []tfexec.ApplyOption{tfexec.DirOrPlan(path)}
	if opts.Parallelism > 0 {
		applyOpts = append(applyOpts, tfexec.Parallelism(opts.Parallelism))
	}
	err = tf.Apply(ctx, applyOpts...)
	flush()
	if err != nil {
		applyErr := e.commandError("apply", ctx, err)
		e.keepUnsavedState(planID, applyErr)
		return applyErr
	}
	return nil
}

// DestroyOptions are the inputs of Destroy.
type DestroyOptions struct {
	Variables Variables
	Targets   []string
}

// Destroy destroys everything in the state without a saved plan.
func (e *Executor) Destroy(ctx context.Context, opts DestroyOptions, logf LogFunc) error {
	tf, flush, err := e.moduleCommand(logf)
	if err != nil {
		return err
	}
	varFiles, cleanup, explain, err := e.commandVariables(opts.Variables)
	if err != nil {
		return err
	}
	defer cleanup()
	var destroyOpts []tfexec.DestroyOption
	for _, f := range varFiles {
		destroyOpts = append(destroyOpts, tfexec.VarFile(f))
	}
	for _, t := range opts.Targets {
		destroyOpts = append(destroyOpts, tfexec.Target(t))
	}
	err = tf.Destroy(ctx, destroyOpts...)
	flush()
	if err != nil {
		return explain(e.commandError("destroy", ctx, err))
	}
	return nil
}

// OutputValue is one root output, sensitive ones in clear.
type OutputValue struct {
	Sensitive bool
	Type      json.RawMessage
	Value     json.RawMessage
}

// Outputs returns every root output from the state. Sensitive values are
// returned in clear (flagged) and taught to the redactor.
func (e *Executor) Outputs(ctx context.Context) (map[string]OutputValue, error) {
	tf, _, err := e.moduleCommand(nil)
	if err != nil {
		return nil, err
	}
	outs, err := tf.Output(ctx)
	if err != nil {
		return nil, e.commandError("output", ctx, err)
	}
	res := make(map[string]OutputValue, len(outs))
	for name, o := range outs {
		if o.Sensitive {
			e.learnJSON(o.Value)
		}
		res[name] = OutputValue{Sensitive: o.Sensitive, Type: o.Type, Value: o.Value}
	}
	return res, nil
}

// ForceUnlock removes the state lock lockID.
func (e *Executor) ForceUnlock(ctx context.Context, lockID string) error {
	if lockID == "" {
		return fmt.Errorf("%w: a lock id is required", ErrInvalidArgument)
	}
	tf, _, err := e.moduleCommand(nil)
	if err != nil {
		return err
	}
	if err := tf.ForceUnlock(ctx, lockID); err != nil {
		return e.commandError("force-unlock", ctx, err)
	}
	return nil
}
