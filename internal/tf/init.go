package tf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/terraform-exec/tfexec"
)

// HTTPBackend configures tofu's http backend. Everything, the key included,
// goes through TF_HTTP_* environment variables, which tofu does not write
// into .terraform or into plan files.
type HTTPBackend struct {
	Address, LockAddress, UnlockAddress    string
	LockMethod, UnlockMethod, UpdateMethod string
	ClientCertificatePEM, ClientKeyPEM     []byte
	CACertificatePEM                       []byte
}

// InitOptions are the inputs of Init.
type InitOptions struct {
	// Path is the module directory relative to the source root.
	Path string
	// Workspace is selected, created if missing (not with HTTPBackend).
	Workspace string
	// HTTPBackend, when set, overrides the module's backend.
	HTTPBackend *HTTPBackend
	// OwnBackend, when set, overrides the module's backend with the
	// Stack's own; it excludes HTTPBackend.
	OwnBackend *OwnBackend
	Upgrade    bool
	// Files are written before init (spec.fileMappings).
	Files []MappedFile
}

// InitResult reports the tool and provider versions in use.
type InitResult struct {
	Version          string
	ProviderVersions map[string]string
}

// Init initialises the module at opts.Path inside the source.
func (e *Executor) Init(ctx context.Context, opts InitOptions, logf LogFunc) (*InitResult, error) {
	dir, err := e.moduleDirFor(opts.Path)
	if err != nil {
		return nil, err
	}
	e.moduleDir = ""
	if err := e.writeMappedFiles(dir, opts.Files); err != nil {
		return nil, err
	}
	if err := e.configureBackend(dir, opts); err != nil {
		return nil, err
	}

	version, err := e.runInit(ctx, dir, opts, logf)
	if err != nil {
		return nil, err
	}
	if ws := opts.Workspace; ws != "" && ws != "default" && opts.HTTPBackend == nil {
		if err := e.selectWorkspace(ctx, dir, ws, logf); err != nil {
			return nil, err
		}
	}
	e.moduleDir = dir
	providers, err := lockedProviders(dir)
	if err != nil {
		return nil, err
	}
	return &InitResult{Version: version, ProviderVersions: providers}, nil
}

// runInit runs init and returns the tool's version. tofu names its version
// in the first message of `init -json`, so no `version` process runs;
// terraform before 1.9 has no `init -json`, and is asked through
// terraform-exec.
func (e *Executor) runInit(ctx context.Context, dir string, opts InitOptions, logf LogFunc) (string, error) {
	if e.cfg.Binary == BinaryTofu {
		args := []string{"init", "-input=false", "-no-color", "-json", "-reconfigure"}
		if opts.Upgrade {
			args = append(args, "-upgrade")
		}
		stream := e.uiStreamTo(logf)
		if err := e.runJSON(ctx, "init", dir, e.directEnv("GOGC="+initGOGC), stream, logf, args...); err != nil {
			return "", err
		}
		if v := stream.toolVersion(); v != "" {
			return v, nil
		}
		return e.version(ctx, dir)
	}
	// The version first, without logs: terraform-exec copies the output of
	// its version checks to the command's stdout, and caches the answer
	// for every later command of this executor.
	version, err := e.version(ctx, dir)
	if err != nil {
		return "", err
	}
	tf, flush, err := e.command(dir, logf)
	if err != nil {
		return "", err
	}
	err = tf.Init(ctx, tfexec.Upgrade(opts.Upgrade), tfexec.Reconfigure(true))
	flush()
	if err != nil {
		return "", e.commandError("init", ctx, err)
	}
	return version, nil
}

// uiStreamTo reads a -json stream into logf as the lines a person reads.
func (e *Executor) uiStreamTo(logf LogFunc) *uiStream {
	return newUIStream(newLineWriter(e.redactor, func(l string) { logIfSet(logf, Stdout, l) }))
}

// version is the tool's version, asked once per executor.
func (e *Executor) version(ctx context.Context, dir string) (string, error) {
	quiet, _, err := e.command(dir, nil)
	if err != nil {
		return "", err
	}
	v, _, err := quiet.Version(ctx, false)
	if err != nil {
		return "", e.commandError("version", ctx, err)
	}
	return v.String(), nil
}

func (e *Executor) selectWorkspace(ctx context.Context, dir, ws string, logf LogFunc) error {
	tf, flush, err := e.command(dir, logf)
	if err != nil {
		return err
	}
	defer flush()
	existing, _, err := tf.WorkspaceList(ctx)
	if err != nil {
		return e.commandError("workspace list", ctx, err)
	}
	for _, name := range existing {
		if name == ws {
			if err := tf.WorkspaceSelect(ctx, ws); err != nil {
				return e.commandError("workspace select", ctx, err)
			}
			return nil
		}
	}
	if err := tf.WorkspaceNew(ctx, ws); err != nil {
		return e.commandError("workspace new", ctx, err)
	}
	return nil
}

// moduleDirFor resolves the module directory inside the source.
func (e *Executor) moduleDirFor(rel string) (string, error) {
	rel = strings.TrimPrefix(filepath.ToSlash(rel), "./")
	if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") || strings.Contains(rel, "/../") || strings.HasSuffix(rel, "/..") {
		return "", fmt.Errorf("%w: path %q must be relative and inside the source", ErrInvalidArgument, rel)
	}
	src := e.SourceDir()
	dir := filepath.Join(src, filepath.FromSlash(rel))
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if entries, _ := os.ReadDir(src); len(entries) == 0 {
				return "", ErrNoSource
			}
			return "", fmt.Errorf("%w: path %q does not exist in the source", ErrInvalidArgument, rel)
		}
		return "", fmt.Errorf("failed to resolve path %q: %w", rel, err)
	}
	realSrc, err := filepath.EvalSymlinks(src)
	if err != nil {
		return "", fmt.Errorf("failed to resolve the source directory: %w", err)
	}
	if resolved != realSrc && !strings.HasPrefix(resolved, realSrc+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: path %q leaves the source", ErrInvalidArgument, rel)
	}
	if fi, err := os.Stat(resolved); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%w: path %q is not a directory", ErrInvalidArgument, rel)
	}
	if entries, _ := os.ReadDir(realSrc); len(entries) == 0 {
		return "", ErrNoSource
	}
	return resolved, nil
}
