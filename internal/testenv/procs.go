package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// BuildTerrace builds ./cmd/terrace of this checkout into dir, and
// ./cmd/terrace-runner beside it (the dev image takes the runner pods'
// binary from there), static as in the image, and returns terrace's path;
// the progress goes to stderr. Test packages that run the binary (in the dev cluster's image or
// as controller processes) call it from TestMain.
func BuildTerrace(dir string) (string, error) {
	begin := time.Now()
	for _, cmd := range []string{"terrace", "terrace-runner"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd)
		build.Dir = RepoRoot()
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return "", fmt.Errorf("failed to build %s: %w", cmd, err)
		}
	}
	bin := filepath.Join(dir, "terrace")
	fmt.Fprintf(os.Stderr, "built %s and terrace-runner in %s\n", bin, time.Since(begin).Round(time.Second))
	return bin, nil
}

// FreeLoopbackAddrs returns n distinct free 127.0.0.1:port addresses.
func FreeLoopbackAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}
