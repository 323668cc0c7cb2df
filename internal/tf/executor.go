// Package tf runs tofu (or terraform) for the runner through terraform-exec,
// keeps every file it touches under one work directory, passes variables
// only through 0600 var files, and redacts sensitive values from everything
// it hands back except outputs.
package tf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/terraform-exec/tfexec"
)

// Binary names the tool flavour.
const (
	BinaryTofu      = "tofu"
	BinaryTerraform = "terraform"
)

// Config configures an Executor.
type Config struct {
	// Binary is BinaryTofu (default) or BinaryTerraform.
	Binary string
	// BinaryPath is the executable; default: Binary looked up on PATH.
	BinaryPath string
	// WorkDir holds everything: source, plan files, var files, .terraform,
	// the CLI config and temporary files. It is created if missing.
	WorkDir string
	// ProviderMirror, when set, is the only place providers are installed
	// from (a CLI-config filesystem_mirror).
	ProviderMirror string
	// Env is the environment tofu runs with, before Terrace's own settings;
	// nil means os.Environ(). Variables tofu must not get from the
	// environment (TF_VAR_*, TF_LOG*, TF_WORKSPACE, TF_CLI_ARGS*, ...) are
	// dropped.
	Env []string
	// InterruptGrace is how long tofu may take to stop after SIGINT before
	// it is killed. Default 2 minutes.
	InterruptGrace time.Duration
}

// LogFunc receives each redacted line of tofu's output, without newline.
type LogFunc func(stream Stream, line string)

// Stream says where a log line came from.
type Stream int

const (
	Stdout Stream = iota + 1
	Stderr
)

// Executor runs tofu commands in one work directory. It is not safe for
// concurrent use: the runner serialises calls.
type Executor struct {
	cfg       Config
	execPath  string
	cliConfig string

	// moduleDir is set by Init; the backend environment with it.
	moduleDir  string
	backendEnv map[string]string
	// home is HOME for tofu once a file mapping wrote into it.
	home string

	redactor *Redactor
	// extraSensitive are variables the caller named sensitive.
	extraSensitive map[string]bool

	// handles are terraform-exec handles by directory, reused so that its
	// version cache holds: `version -json` runs once per executor instead
	// of before every command that checks the version.
	handles map[string]*tfexec.Terraform
	// learned are the saved plans (path → digest) whose sensitive values
	// the redactor already knows, so applying a plan made here needs no
	// second `show -json`.
	learned map[string]string
	// processes counts the tool's processes started, for the runner's
	// Usage; read while a command runs, so atomic.
	processes atomic.Int64
}

// Processes is how many tofu (or terraform) processes the executor has
// started, version checks included.
func (e *Executor) Processes() int64 { return e.processes.Load() }

// processCounter is a terraform-exec logger that counts the commands it
// starts: terraform-exec logs every command it builds, just before running
// it. Nothing is printed (the command line names the work files).
type processCounter struct{ n *atomic.Int64 }

func (c processCounter) Printf(format string, _ ...any) {
	if strings.HasPrefix(format, "[INFO] running Terraform command") {
		c.n.Add(1)
	}
}

// planIDPattern is a plan ID's characters; its length (1 to maxPlanIDLen)
// is checked apart (see backendTypePattern).
var planIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

const maxPlanIDLen = 128

// ErrNotInitialized is returned by calls that need Init first.
var ErrNotInitialized = errors.New("the module is not initialized: call Init first")

// ErrNoSource is returned by Init before any source was extracted.
var ErrNoSource = errors.New("no source: upload or fetch one first")

// ErrPlanNotFound is returned for an unknown plan id.
var ErrPlanNotFound = errors.New("plan not found")

// ErrInvalidArgument wraps errors about a caller's bad input.
var ErrInvalidArgument = errors.New("invalid argument")

// New prepares the work directory and the CLI config file.
func New(cfg Config) (*Executor, error) {
	if cfg.Binary == "" {
		cfg.Binary = BinaryTofu
	}
	if cfg.Binary != BinaryTofu && cfg.Binary != BinaryTerraform {
		return nil, fmt.Errorf("%w: binary must be %q or %q, not %q", ErrInvalidArgument, BinaryTofu, BinaryTerraform, cfg.Binary)
	}
	if cfg.WorkDir == "" {
		return nil, fmt.Errorf("%w: a work directory is required", ErrInvalidArgument)
	}
	if cfg.InterruptGrace <= 0 {
		cfg.InterruptGrace = 2 * time.Minute
	}
	workDir, err := filepath.Abs(cfg.WorkDir)
	if err != nil {
		return nil, fmt.Errorf("failed to resolve work dir: %w", err)
	}
	cfg.WorkDir = workDir
	execPath := cfg.BinaryPath
	if execPath == "" {
		execPath = cfg.Binary
	}
	if !strings.Contains(execPath, string(filepath.Separator)) {
		found, err := exec.LookPath(execPath)
		if err != nil {
			return nil, fmt.Errorf("failed to find %s: %w", execPath, err)
		}
		execPath = found
	}
	for _, dir := range []string{workDir, filepath.Join(workDir, "source"), filepath.Join(workDir, "plans"), filepath.Join(workDir, "vars"), filepath.Join(workDir, "tmp")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("failed to create %s: %w", dir, err)
		}
	}
	e := &Executor{
		cfg: cfg, execPath: execPath, cliConfig: filepath.Join(workDir, "cli.tfrc"), redactor: NewRedactor(),
		extraSensitive: map[string]bool{}, handles: map[string]*tfexec.Terraform{}, learned: map[string]string{},
	}
	if err := os.WriteFile(e.cliConfig, []byte(cliConfig(cfg.ProviderMirror)), 0o600); err != nil {
		return nil, fmt.Errorf("failed to write CLI config: %w", err)
	}
	return e, nil
}

// cliConfig is the runner's own CLI configuration: no checkpoint calls and,
// with a mirror, providers only from that mirror (every registry is
// offline for a runner that uses one).
func cliConfig(mirror string) string {
	var b strings.Builder
	b.WriteString("disable_checkpoint = true\n")
	if mirror != "" {
		fmt.Fprintf(&b, "provider_installation {\n  filesystem_mirror {\n    path = %s\n  }\n}\n", hclString(mirror))
	}
	return b.String()
}

// hclString quotes s as an HCL string literal.
func hclString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "${", "$${", "%{", "%%{")
	return `"` + r.Replace(s) + `"`
}

// WorkDir is the root of everything this executor writes.
func (e *Executor) WorkDir() string { return e.cfg.WorkDir }

// SourceDir is where the module source must be extracted.
func (e *Executor) SourceDir() string { return filepath.Join(e.cfg.WorkDir, "source") }

// TempDir is for temporary files (spooled archives, plan uploads).
func (e *Executor) TempDir() string { return filepath.Join(e.cfg.WorkDir, "tmp") }

// ResetSource empties the source directory before a new source is
// extracted; the module must be initialised again afterwards.
func (e *Executor) ResetSource() error {
	if err := os.RemoveAll(e.SourceDir()); err != nil {
		return fmt.Errorf("failed to remove the previous source: %w", err)
	}
	if err := os.MkdirAll(e.SourceDir(), 0o700); err != nil {
		return fmt.Errorf("failed to create the source directory: %w", err)
	}
	e.moduleDir = ""
	return nil
}

// Redactor returns the redactor holding every sensitive value seen so far.
func (e *Executor) Redactor() *Redactor { return e.redactor }

// environment is what tofu runs with: the base environment without what
// terraform-exec manages or refuses, plus the runner's settings.
func (e *Executor) environment() map[string]string {
	base := e.cfg.Env
	if base == nil {
		base = os.Environ()
	}
	env := map[string]string{}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" || dropFromEnv(k) {
			continue
		}
		env[k] = v
	}
	env = tfexec.CleanEnv(env)
	env["CHECKPOINT_DISABLE"] = "1"
	env["TF_CLI_CONFIG_FILE"] = e.cliConfig
	env["TMPDIR"] = e.TempDir()
	env["PLUGIN_UNIX_SOCKET_DIR"] = pluginSocketDir(e.TempDir())
	// tofu creates its config dir at start: ~/.terraform.d, or
	// $XDG_CONFIG_HOME/opentofu when the former does not exist. Point it
	// into the work dir unless the pod chose a place.
	if _, ok := env["XDG_CONFIG_HOME"]; !ok {
		env["XDG_CONFIG_HOME"] = filepath.Join(e.cfg.WorkDir, "config")
	}
	for k, v := range e.backendEnv {
		env[k] = v
	}
	if e.home != "" {
		env["HOME"] = e.home
	}
	return env
}

// maxPluginSocketDirLen keeps provider plugin socket paths (dir +
// "/plugin" + ~10 digits) under the 108-byte limit of unix socket paths.
const maxPluginSocketDirLen = 80

// pluginSocketDir picks where provider plugins create their sockets. A
// pod's work directory can be nested too deep for a socket path (a
// kubelet's pod volumes are under its root directory), and a provider that cannot
// listen fails with an opaque handshake error; fall back to a short
// writable temporary directory.
func pluginSocketDir(preferred string) string {
	for _, dir := range []string{preferred, os.Getenv("TMPDIR"), os.TempDir(), "/tmp"} {
		if dir == "" || len(dir) > maxPluginSocketDirLen {
			continue
		}
		if f, err := os.CreateTemp(dir, ".socket-probe-"); err == nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
			return dir
		}
	}
	return preferred
}

// dropFromEnv lists variables the runner sets itself or that would move
// files out of the work directory.
func dropFromEnv(k string) bool {
	switch k {
	case "TF_CLI_CONFIG_FILE", "TERRAFORM_CONFIG", "TF_DATA_DIR", "TMPDIR", "CHECKPOINT_DISABLE", "PLUGIN_UNIX_SOCKET_DIR":
		return true
	}
	return strings.HasPrefix(k, "TF_HTTP_") || strings.HasPrefix(k, "TF_VAR_") || strings.HasPrefix(k, "TF_LOG")
}

// command returns a terraform-exec handle for dir. With logf, stdout and
// stderr are streamed to it line by line, redacted; JSON commands get no
// logf, so their output (which holds sensitive values) never reaches logs.
func (e *Executor) command(dir string, logf LogFunc) (*tfexec.Terraform, func(), error) {
	tf := e.handles[dir]
	if tf == nil {
		var err error
		if tf, err = tfexec.NewTerraform(dir, e.execPath); err != nil {
			return nil, nil, fmt.Errorf("failed to prepare %s: %w", e.cfg.Binary, err)
		}
		tf.SetLogger(processCounter{&e.processes})
		e.handles[dir] = tf
	}
	tf.SetStdout(nil)
	tf.SetStderr(nil)
	if err := tf.SetEnv(e.environment()); err != nil {
		return nil, nil, fmt.Errorf("failed to set the environment of %s: %w", e.cfg.Binary, err)
	}
	if err := tf.SetWaitDelay(e.cfg.InterruptGrace); err != nil {
		return nil, nil, fmt.Errorf("failed to set the interrupt grace period: %w", err)
	}
	flush := func() {}
	if logf != nil {
		out := newLineWriter(e.redactor, func(l string) { logf(Stdout, l) })
		errw := newLineWriter(e.redactor, func(l string) { logf(Stderr, l) })
		tf.SetStdout(out)
		tf.SetStderr(errw)
		flush = func() { out.Flush(); errw.Flush() }
	}
	return tf, flush, nil
}

// moduleCommand is command in the initialised module directory.
func (e *Executor) moduleCommand(logf LogFunc) (*tfexec.Terraform, func(), error) {
	if e.moduleDir == "" {
		return nil, nil, ErrNotInitialized
	}
	return e.command(e.moduleDir, logf)
}

// commandError turns a failed run into an error without sensitive values.
// A cancelled context is reported as such, so callers can map it.
func (e *Executor) commandError(what string, ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s %s interrupted: %w", e.cfg.Binary, what, ctxErr)
	}
	msg := e.redactor.String(strings.TrimSpace(err.Error()))
	if oom := oomExplanation(err, cgroupRoot); oom != "" {
		msg += ": " + oom
	}
	return &CommandError{Op: e.cfg.Binary + " " + what, Message: msg}
}

// CommandError is a tofu command that exited with an error. Message is
// tofu's own diagnostics (redacted), e.g. naming the file and line of an
// invalid configuration.
type CommandError struct {
	Op      string
	Message string
}

func (e *CommandError) Error() string { return fmt.Sprintf("%s failed: %s", e.Op, e.Message) }

// planPath returns the saved plan file of id.
func (e *Executor) planPath(id string) (string, error) {
	if len(id) > maxPlanIDLen || !planIDPattern.MatchString(id) || id == "." || id == ".." {
		return "", fmt.Errorf("%w: plan id %q must be 1-128 letters, digits, '.', '_' or '-'", ErrInvalidArgument, id)
	}
	return filepath.Join(e.cfg.WorkDir, "plans", id+".tfplan"), nil
}

// existingPlanPath is planPath for a plan that must exist.
func (e *Executor) existingPlanPath(id string) (string, error) {
	p, err := e.planPath(id)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%w: %s", ErrPlanNotFound, id)
		}
		return "", fmt.Errorf("failed to read plan %s: %w", id, err)
	}
	return p, nil
}
