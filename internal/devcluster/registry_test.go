package devcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// The dev image takes the terrace-runner beside terrace only when both were
// built from the same source: a stale one would run old code in every run.
func TestTheDevImageTakesOnlyARunnerOfTheSameBuild(t *testing.T) {
	dir := t.TempDir()
	build := func(name string, args ...string) string {
		t.Helper()
		out := filepath.Join(dir, name)
		cmd := exec.Command("go", append(append([]string{"build", "-o", out}, args...), "./cmd/terrace-runner")...)
		cmd.Dir = testenv.RepoRoot()
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
		return out
	}
	plain := build("plain")
	again := build("again")
	versioned := build("versioned", "-ldflags", "-X github.com/terrace-dev/terrace/internal/version.Version=v9.9.9")
	if !sameBuild(plain, again) {
		t.Error("two builds of one source were taken for different builds")
	}
	if sameBuild(plain, versioned) {
		t.Error("builds with other linker flags (another version) were taken for one build")
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if sameBuild(plain, script) {
		t.Error("a file that is no Go binary was taken for the same build")
	}
}
