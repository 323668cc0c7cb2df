package tf

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestOOMExplanationNamesTheLimit(t *testing.T) {
	killed := exec.Command("sh", "-c", "kill -9 $$").Run()
	exited := exec.Command("sh", "-c", "exit 1").Run()
	v1 := t.TempDir()
	writeFile(t, filepath.Join(v1, "memory", "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	writeFile(t, filepath.Join(v1, "memory", "memory.limit_in_bytes"), "6291456\n")
	v2 := t.TempDir()
	writeFile(t, filepath.Join(v2, "memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
	writeFile(t, filepath.Join(v2, "memory.max"), "max\n")
	quiet := t.TempDir()
	writeFile(t, filepath.Join(quiet, "memory.events"), "oom 0\noom_kill 0\n")
	for _, tc := range []struct {
		name string
		err  error
		root string
		want string
	}{
		{"killed under an OOM kill, cgroup v1", killed, v1, "out-of-memory killer: the runner container's memory limit (6 MiB) is too low"},
		{"killed under an OOM kill, cgroup v2, no limit", killed, v2, "out-of-memory killer: the runner container's memory limit is too low"},
		{"killed, no OOM kill counted", killed, quiet, ""},
		{"exited with an error", exited, v1, ""},
		{"not a process error", errors.New("state locked"), v1, ""},
		{"no cgroup files", killed, t.TempDir(), ""},
	} {
		got := oomExplanation(tc.err, tc.root)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
