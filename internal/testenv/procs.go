package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// BuildTerrace builds ./cmd/terrace of this checkout into dir and returns
// the binary's path; its progress goes to stderr. Test packages that run
// the binary (as devnode's pods or as controller processes) call it from
// TestMain.
func BuildTerrace(dir string) (string, error) {
	bin := filepath.Join(dir, "terrace")
	build := exec.Command("go", "build", "-o", bin, "./cmd/terrace")
	build.Dir = RepoRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	begin := time.Now()
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("failed to build terrace: %w", err)
	}
	fmt.Fprintf(os.Stderr, "built %s in %s\n", bin, time.Since(begin).Round(time.Second))
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
