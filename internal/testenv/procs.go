package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// Descendants lists the live (not zombie) processes below pid, read from
// /proc: tofu and its children under a runner process, for example.
func Descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name is in parentheses and may contain spaces.
		s := string(stat)
		end := strings.LastIndex(s, ")")
		if end < 0 {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], p)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range children[next] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
