package tf

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// standInTofu writes a tofu that records the environment it was started
// with to envFile and answers init with the version message tofu sends.
func standInTofu(t *testing.T, envFile string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tofu")
	script := "#!/bin/sh\nenv > " + envFile + "\n" +
		`echo '{"@level":"info","@message":"OpenTofu 1.12.6","type":"version","tofu":"1.12.6"}'` + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func initEnv(t *testing.T, runnerEnv []string) map[string]string {
	t.Helper()
	envFile := filepath.Join(t.TempDir(), "env")
	e := newTestExecutor(t, standInTofu(t, envFile), runnerEnv, "")
	writeModule(t, e, map[string]string{"main.tf": "\n"})
	if _, err := e.Init(context.Background(), InitOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// init runs with a lazier garbage collector (its start is mostly the
// collector), unless the pod's environment chose GOGC itself.
func TestInitRunsWithGOGCUnlessThePodSetsIt(t *testing.T) {
	if got := initEnv(t, []string{"PATH=/usr/bin:/bin"})["GOGC"]; got != initGOGC {
		t.Errorf("init ran with GOGC=%q, want %s", got, initGOGC)
	}
	if got := initEnv(t, []string{"PATH=/usr/bin:/bin", "GOGC=50"})["GOGC"]; got != "50" {
		t.Errorf("init ran with GOGC=%q, want the pod's 50", got)
	}
}
