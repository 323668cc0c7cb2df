package tf

import "github.com/hashicorp/terraform-exec/tfexec"

// ApplyOptions are the inputs of ApplyWith.
type ApplyOptions struct {
	PlanID string
	// Parallelism passes -parallelism when positive.
	Parallelism int
}

// planFlags are the plan command's options.
func planFlags(opts PlanOptions, out string, varFiles []string) []tfexec.PlanOption {
	flags := []tfexec.PlanOption{tfexec.Out(out), tfexec.Destroy(opts.Destroy), tfexec.RefreshOnly(opts.RefreshOnly)}
	for _, f := range varFiles {
		flags = append(flags, tfexec.VarFile(f))
	}
	for _, t := range opts.Targets {
		flags = append(flags, tfexec.Target(t))
	}
	for _, a := range opts.Replace {
		flags = append(flags, tfexec.Replace(a))
	}
	if opts.Parallelism > 0 {
		flags = append(flags, tfexec.Parallelism(opts.Parallelism))
	}
	if opts.SkipRefresh {
		flags = append(flags, tfexec.Refresh(false))
	}
	if opts.NoLock {
		flags = append(flags, tfexec.Lock(false))
	}
	return flags
}
