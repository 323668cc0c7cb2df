package devcluster

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSandboxJoinsTheHostOverItsLinkOnlyAndLeavesNothing starts the node's
// namespaces as terrace dev does, reaches a process inside from the host
// over the link, checks that the node has no way off the machine, and that
// stopping it removes the link and its routes.
func TestSandboxJoinsTheHostOverItsLinkOnlyAndLeavesNothing(t *testing.T) {
	// What terrace dev itself checks first; make test runs as root and
	// installs the tools, so a lack is a failure, not a skip.
	if err := CheckNodeRequirements(filepath.Join(ToolsCacheDir(), "node-bin"), filepath.Join(ToolsCacheDir(), "cni-plugins-"+CNIPluginsVersion)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	sb, err := startSandbox(ctx, dir, "sandbox-test")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.stop()
	n := sb.net

	if rules := runInSandbox(t, sb, dir, "nft", "list", "ruleset"); !strings.Contains(rules, "terrace-dev-hermetic") {
		t.Fatalf("the node's namespace has no hermetic rules:\n%s", rules)
	}
	if routes := runInSandbox(t, sb, dir, "ip", "-4", "route"); strings.Contains(routes, "default") {
		t.Fatalf("the node has a default route, so pods could leave the machine:\n%s", routes)
	}
	if got := strings.TrimSpace(runInSandbox(t, sb, dir, "cat", "/proc/sys/kernel/hostname")); got != "sandbox-test" {
		t.Fatalf("the node's hostname is %q", got)
	}
	// The host reaches the node over the link: a TCP connect to a closed
	// port is refused (not timed out) by the node's kernel.
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(n.NodeIP.String(), "9"), 2*time.Second)
	if err == nil {
		_ = conn.Close()
	} else if !strings.Contains(err.Error(), "refused") {
		t.Fatalf("the host cannot reach the node at %s: %v", n.NodeIP, err)
	}

	sb.stop()
	if linkExists(n.HostIf) {
		t.Fatalf("the link %s outlived the node", n.HostIf)
	}
	out, _ := exec.Command("ip", "-4", "route").Output()
	if strings.Contains(string(out), n.PodCIDR.String()) {
		t.Fatalf("a route to the pods outlived the node:\n%s", out)
	}
}

// runInSandbox runs a command in the node's namespaces and returns its
// output (the last 50 lines).
func runInSandbox(t *testing.T, sb *sandbox, dir, bin string, args ...string) string {
	t.Helper()
	logPath := filepath.Join(dir, bin+".log")
	p, err := sb.command(bin, bin, args, nil, logPath)
	if err != nil {
		t.Fatal(err)
	}
	<-p.done
	return tailFile(logPath, 50)
}
