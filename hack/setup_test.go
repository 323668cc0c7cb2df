// Package hack_test checks the set-up the README promises: `make test` and
// `make demo` install what a fresh machine lacks themselves.
package hack_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// makeDryRun prints the commands `make target` would run, in order.
func makeDryRun(t *testing.T, target string) []string {
	t.Helper()
	cmd := exec.Command("make", "-n", target)
	cmd.Dir = ".."
	// make -n still runs the recursive $(MAKE) lines: keep them out of
	// .ci/run's record of phases.
	cmd.Env = append(os.Environ(), "TERRACE_PHASES_FILE=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n %s: %v", target, err)
	}
	return strings.Split(string(out), "\n")
}

func indexOf(lines []string, substr string) int {
	for i, l := range lines {
		if strings.Contains(l, substr) {
			return i
		}
	}
	return -1
}

func TestMakeTargetsInstallTheirDepsFirst(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed: it is the README's entry point (Debian package make)")
	}
	for _, tc := range []struct{ target, deps, next string }{
		{"test", "hack/install-deps.sh test", "hack/tools/build.sh"},
		{"demo", "hack/install-deps.sh demo", "hack/tools/build.sh"},
	} {
		lines := makeDryRun(t, tc.target)
		deps, next := indexOf(lines, tc.deps), indexOf(lines, tc.next)
		if deps < 0 || next < 0 || deps > next {
			t.Errorf("make %s should run %q (line %d) before %q (line %d):\n%s",
				tc.target, tc.deps, deps, tc.next, next, strings.Join(lines, "\n"))
		}
	}
}

// runInstallDeps runs the script in dry-run mode with PATH set to path.
func runInstallDeps(t *testing.T, profile, path string) string {
	t.Helper()
	cmd := exec.Command("/bin/bash", "install-deps.sh", profile)
	cmd.Env = []string{"PATH=" + path, "TERRACE_DEPS_DRY_RUN=1"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install-deps.sh %s: %v\n%s", profile, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestInstallDepsNamesWhatIsMissing(t *testing.T) {
	empty := t.TempDir() // a PATH with no protoc and no git
	got := runInstallDeps(t, "test", empty)
	for _, pkg := range []string{"git", "protobuf-compiler"} {
		if !strings.Contains(got, pkg) {
			t.Errorf("install-deps.sh test with nothing on PATH = %q, want it to name %s", got, pkg)
		}
	}
	if got := runInstallDeps(t, "demo", empty); got != "git" {
		t.Errorf("install-deps.sh demo with nothing on PATH = %q, want only git", got)
	}
}

func TestInstallDepsIsSilentWhenEverythingIsPresent(t *testing.T) {
	// `make test` has installed everything before this runs; run alone on a
	// fresh machine, the test installs it the same way first.
	install := exec.Command("/bin/bash", "install-deps.sh", "test")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("install-deps.sh test: %v\n%s", err, out)
	}
	postgres, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	_, protocErr := exec.LookPath("protoc")
	_, gitErr := exec.LookPath("git")
	if len(postgres) == 0 || protocErr != nil || gitErr != nil {
		t.Fatalf("after install-deps.sh: postgres %v, protoc %v, git %v", postgres, protocErr, gitErr)
	}
	if got := runInstallDeps(t, "test", os.Getenv("PATH")); got != "" {
		t.Errorf("install-deps.sh test printed %q on a machine that has everything, want nothing", got)
	}
}
