package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDriftWithRealTofu builds the provider into a filesystem mirror, installs it
// offline with the real tofu, and walks the life cycle the drift tests rely on:
// apply, no-change plan, drift by hand (edit and removal), repair, destroy.
func TestDriftWithRealTofu(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	tofu := findTofu(t)
	root := t.TempDir()
	mirror := filepath.Join(root, "mirror")
	buildIntoMirror(ctx, t, mirror)

	cliConfig := filepath.Join(root, "cli.tfrc")
	writeTestFile(t, cliConfig, fmt.Sprintf(`provider_installation {
  filesystem_mirror {
    path    = %q
    include = ["registry.opentofu.org/terrace-dev/*"]
  }
}
`, mirror))

	target := filepath.Join(root, "managed", "nested", "hello.txt")
	moduleDir := filepath.Join(root, "module")
	writeTestFile(t, filepath.Join(moduleDir, "main.tf"), fmt.Sprintf(`terraform {
  required_providers {
    testfile = {
      source  = "terrace-dev/testfile"
      version = "0.1.0"
    }
  }
}

resource "testfile_file" "hello" {
  path    = %q
  content = "hello from terrace\n"
}

output "id" {
  value = testfile_file.hello.id
}
`, target))

	tf := &tofuRunner{
		bin: tofu,
		dir: moduleDir,
		env: append(os.Environ(),
			"TF_CLI_CONFIG_FILE="+cliConfig,
			"CHECKPOINT_DISABLE=1",
			"TF_IN_AUTOMATION=1",
			"TF_INPUT=0",
			"TF_PLUGIN_CACHE_DIR=",
		),
	}

	out := tf.mustRun(ctx, t, "init", "-input=false", "-no-color")
	if !strings.Contains(out, "terrace-dev/testfile v0.1.0") {
		t.Fatalf("init did not install terrace-dev/testfile v0.1.0 from the mirror:\n%s", out)
	}

	tf.mustRun(ctx, t, "apply", "-auto-approve", "-input=false", "-no-color")
	assertFile(t, target, "hello from terrace\n")
	if got := strings.TrimSpace(tf.mustRun(ctx, t, "output", "-raw", "id")); got != target {
		t.Fatalf("id = %q, want the path %q", got, target)
	}

	if code, out := tf.plan(ctx, t); code != 0 {
		t.Fatalf("plan right after apply: exit code %d, want 0 (no changes):\n%s", code, out)
	}

	// Drift: the file is edited by hand; the plan must update it back.
	writeTestFile(t, target, "edited by hand\n")
	code, out := tf.plan(ctx, t)
	if code != 2 || !strings.Contains(out, "Plan: 0 to add, 1 to change, 0 to destroy.") {
		t.Fatalf("plan after a hand edit: exit code %d, want 2 with 1 to change:\n%s", code, out)
	}
	if !strings.Contains(out, "- edited by hand") || !strings.Contains(out, "+ hello from terrace") {
		t.Fatalf("plan after a hand edit does not show the content going from disk back to config:\n%s", out)
	}
	tf.mustRun(ctx, t, "apply", "-auto-approve", "-input=false", "-no-color")
	assertFile(t, target, "hello from terrace\n")
	if code, out := tf.plan(ctx, t); code != 0 {
		t.Fatalf("plan after the repair: exit code %d, want 0:\n%s", code, out)
	}

	// Drift: the file is removed by hand; the plan must create it again.
	if err := os.Remove(target); err != nil {
		t.Fatalf("failed to remove %s: %v", target, err)
	}
	code, out = tf.plan(ctx, t)
	if code != 2 || !strings.Contains(out, "Plan: 1 to add, 0 to change, 0 to destroy.") {
		t.Fatalf("plan after removing the file: exit code %d, want 2 with 1 to add:\n%s", code, out)
	}
	tf.mustRun(ctx, t, "apply", "-auto-approve", "-input=false", "-no-color")
	assertFile(t, target, "hello from terrace\n")

	tf.mustRun(ctx, t, "destroy", "-auto-approve", "-input=false", "-no-color")
	if _, err := os.Stat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after destroy, stat %s: err = %v, want not exist", target, err)
	}
	if code, out := tf.plan(ctx, t); code != 2 || !strings.Contains(out, "Plan: 1 to add, 0 to change, 0 to destroy.") {
		t.Fatalf("plan after destroy: exit code %d, want 2 with 1 to add:\n%s", code, out)
	}
}

// tofuRunner runs one tofu binary in one module directory with a fixed environment.
type tofuRunner struct {
	bin string
	dir string
	env []string
}

func (r *tofuRunner) run(ctx context.Context, t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, r.bin, args...)
	cmd.Dir = r.dir
	cmd.Env = r.env
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &exitErr):
		return exitErr.ExitCode(), out.String()
	default:
		t.Fatalf("failed to run tofu %s: %v\n%s", strings.Join(args, " "), err, out.String())
		return -1, ""
	}
}

func (r *tofuRunner) mustRun(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	code, out := r.run(ctx, t, args...)
	if code != 0 {
		t.Fatalf("tofu %s: exit code %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// plan runs `tofu plan -detailed-exitcode`: 0 no changes, 1 error, 2 changes.
func (r *tofuRunner) plan(ctx context.Context, t *testing.T) (int, string) {
	t.Helper()
	code, out := r.run(ctx, t, "plan", "-detailed-exitcode", "-input=false", "-no-color")
	if code == 1 {
		t.Fatalf("tofu plan failed:\n%s", out)
	}
	return code, out
}

// findTofu returns TERRACE_TOFU, or the path `bash ../build.sh --env` reports.
func findTofu(t *testing.T) string {
	t.Helper()
	tofu := os.Getenv("TERRACE_TOFU")
	if tofu == "" {
		out, err := exec.Command("bash", filepath.Join("..", "build.sh"), "--env").Output()
		if err != nil {
			t.Fatalf("failed to ask hack/tools/build.sh where tofu is: %v", err)
		}
		scanner := bufio.NewScanner(bytes.NewReader(out))
		for scanner.Scan() {
			if value, ok := strings.CutPrefix(scanner.Text(), "TERRACE_TOFU="); ok {
				tofu = value
			}
		}
	}
	if tofu == "" {
		t.Fatal("no tofu: set TERRACE_TOFU or run `make tools`")
	}
	if info, err := os.Stat(tofu); err != nil || info.Mode()&0o111 == 0 {
		t.Fatalf("tofu at %s is not an executable (run `make tools`): %v", tofu, err)
	}
	return tofu
}

// buildIntoMirror builds this provider into the unpacked filesystem-mirror
// layout that hack/tools/build.sh uses.
func buildIntoMirror(ctx context.Context, t *testing.T, mirror string) {
	t.Helper()
	platform := runtime.GOOS + "_" + runtime.GOARCH
	binary := filepath.Join(mirror, "registry.opentofu.org", "terrace-dev", "testfile", version, platform,
		"terraform-provider-testfile_v"+version)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", binary, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("failed to build the provider: %v\n%s", err, out)
	}
}

func writeTestFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatalf("failed to create %s: %v", filepath.Dir(name), err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatalf("failed to write %s: %v", name, err)
	}
}

func assertFile(t *testing.T, name, want string) {
	t.Helper()
	info, err := os.Stat(name)
	if err != nil {
		t.Fatalf("failed to stat %s: %v", name, err)
	}
	if perm := info.Mode().Perm(); perm != 0o644 {
		t.Fatalf("%s has mode %v, want 0644", name, perm)
	}
	got, err := os.ReadFile(name)
	if err != nil {
		t.Fatalf("failed to read %s: %v", name, err)
	}
	if string(got) != want {
		t.Fatalf("%s = %q, want %q", name, got, want)
	}
}
