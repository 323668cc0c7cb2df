package tf

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
)

// The hot path of a run (init, and a plan applied in one pass) starts tofu
// itself rather than through terraform-exec: terraform-exec runs `tofu
// version -json` before the first command of each handle, a whole tofu
// process (~0.15 s) that direct `tofu init && tofu apply` does not pay.
// These commands run with -json, whose first message names the version.

// maxStderrTail bounds the stderr kept for a failed command's error.
const maxStderrTail = 64 << 10

// runJSON runs the tool with args in dir and env (directEnv), its -json
// stdout read by stream and its stderr passed to logf line by line, both
// redacted. Cancelling ctx interrupts tofu (SIGINT) and kills it after the
// grace period, as terraform-exec does.
func (e *Executor) runJSON(ctx context.Context, what, dir string, env []string, stream *uiStream, logf LogFunc, args ...string) error {
	if err := ctx.Err(); err != nil {
		return e.commandError(what, ctx, err)
	}
	e.processes.Add(1)
	cmd := exec.CommandContext(ctx, e.execPath, args...)
	cmd.Dir = dir
	cmd.Env = env
	// Providers die with the runner, and tofu gets its own process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = e.cfg.InterruptGrace
	stderr := &tailWriter{limit: maxStderrTail}
	errLines := newLineWriter(e.redactor, func(l string) {
		logIfSet(logf, Stderr, l)
		stderr.add(l)
	})
	cmd.Stdout, cmd.Stderr = stream, errLines
	err := cmd.Run()
	stream.Flush()
	errLines.Flush()
	if err == nil {
		return nil
	}
	var msg []string
	if diags := stream.errorText(); diags != "" {
		msg = append(msg, diags)
	}
	if tail := strings.TrimSpace(stderr.String()); tail != "" {
		msg = append(msg, tail)
	}
	if len(msg) > 0 && ctx.Err() == nil {
		err = errors.New(strings.Join(msg, "\n\n"))
	}
	return e.commandError(what, ctx, err)
}

// directEnv is environment() as terraform-exec would pass it: in
// automation, no workspace override, no logging to stderr. defaults are
// "KEY=value" settings the environment may override.
func (e *Executor) directEnv(defaults ...string) []string {
	env := e.environment()
	for _, kv := range defaults {
		k, v, _ := strings.Cut(kv, "=")
		if _, set := env[k]; !set {
			env[k] = v
		}
	}
	env["TF_IN_AUTOMATION"] = "1"
	delete(env, "TF_WORKSPACE")
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// initGOGC is the garbage collector's GOGC for `tofu init`, unless the
// runner's environment sets GOGC. Most of an init's CPU is the start of
// tofu itself, whose package initialisation allocates about 8 MB: at the
// default of 100 the collector runs through it, and 400 lets it pass (an
// init's user CPU: about 25 ms at 100, 15 ms at 400). An init holds
// little (the configuration and the lock file) and starts no provider, so
// its memory stays small. Plan and apply keep the default: providers
// inherit tofu's environment, and their heaps are what a pod's memory
// limit is sized for.
const initGOGC = "400"

// tailWriter keeps the last limit bytes of the (already redacted) lines
// added to it.
type tailWriter struct {
	limit int
	b     []byte
}

func (t *tailWriter) add(line string) {
	t.b = append(t.b, line...)
	t.b = append(t.b, '\n')
	if over := len(t.b) - t.limit; over > 0 {
		t.b = t.b[over:]
	}
}

func (t *tailWriter) String() string { return string(t.b) }
