package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// TestProvidersAreLinkedFromTheMirrorNotDownloaded: a run's init installs
// the test provider from the configured filesystem mirror (unpacked
// layout) as a link into the mirror: nothing is downloaded, unpacked or
// copied per run, and no run writes where the next run reads providers.
func TestProvidersAreLinkedFromTheMirrorNotDownloaded(t *testing.T) {
	tr, mirror := startRunnerWithMirror(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": driftModule})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init from the mirror failed: %v", err)
	}
	var installed []string
	err := filepath.Walk(tr.workDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(p, filepath.Join(".terraform", "providers", "registry.opentofu.org", "terrace-dev", "testfile", "0.1.0")) && strings.HasSuffix(p, "linux_amd64") {
			installed = append(installed, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(installed) != 1 {
		t.Fatalf("found the installed test provider at %v, want one place", installed)
	}
	fi, err := os.Lstat(installed[0])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the provider at %s is a %s, want a link into the mirror (a copy per run)", installed[0], fi.Mode())
	}
	target, err := os.Readlink(installed[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(target, mirror) {
		t.Errorf("the provider links to %s, want a place in the mirror %s", target, mirror)
	}
}
