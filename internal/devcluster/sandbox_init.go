package devcluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

// sandboxInitName is the argv[0] under which this program, re-executed by
// startSandbox in new PID, mount, network and UTS namespaces, runs as the
// sandbox's PID 1 instead of its own main (the re-exec idiom; see init).
const sandboxInitName = "terrace-dev-sandbox-init"

// The sandbox init's settings, passed in its environment.
const (
	envSandboxHostname = "TERRACE_SANDBOX_HOSTNAME"
	envSandboxLink     = "TERRACE_SANDBOX_LINK"      // the link's node end, renamed eth0
	envSandboxNodeAddr = "TERRACE_SANDBOX_NODE_ADDR" // 10.S.255.2/30
	envSandboxHostIP   = "TERRACE_SANDBOX_HOST_IP"
	envSandboxPodCIDR  = "TERRACE_SANDBOX_POD_CIDR"
	envSandboxSvcCIDR  = "TERRACE_SANDBOX_SERVICE_CIDR"
	envSandboxBlock    = "TERRACE_SANDBOX_BLOCK" // the slot's /16
	// envSandboxKubeletDir is bound at kubeletRootDir in the namespace.
	envSandboxKubeletDir = "TERRACE_SANDBOX_KUBELET_DIR"
)

// kubeletRootDir is the kubelet's root in the node's mount namespace: a
// short path, because the kubelet listens on unix sockets under it (whose
// paths may not exceed 107 bytes) and the dev cluster's directory can be
// long (a test's temporary directory is named after the test). The files
// are in the dev cluster's directory, bound here.
const kubeletRootDir = "/run/kubelet"

func init() {
	// Any program that links this package (terrace, the e2e tests) can be
	// the sandbox's init: startSandbox runs /proc/self/exe under this name.
	if len(os.Args) > 0 && os.Args[0] == sandboxInitName {
		os.Exit(runSandboxInit())
	}
}

// runSandboxInit is PID 1 of a dev cluster's node. It makes the mounts its
// processes make invisible to the host (a private /run, slave propagation),
// waits for the host to hand it its end of the link, configures the node's
// network, answers "ready" on stdout and then reaps orphans (containerd's
// shims are re-parented to it) until told to stop or its parent dies. When
// it exits, the kernel kills every process left in the PID namespace, so a
// dev cluster leaves no containers behind even after `kill -9`.
func runSandboxInit() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "sandbox init: "+format+"\n", args...)
		return 1
	}
	if err := sandboxMounts(); err != nil {
		return fail("%v", err)
	}
	if err := syscall.Sethostname([]byte(os.Getenv(envSandboxHostname))); err != nil {
		return fail("failed to set the hostname: %v", err)
	}
	fmt.Println("started")
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "link" {
		return fail("the host did not hand over the link (%q, %v)", line, err)
	}
	if err := sandboxNetwork(); err != nil {
		return fail("%v", err)
	}
	fmt.Println("ready")

	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	// stdin closes when the host's end goes away, however it went.
	hostGone := make(chan struct{})
	go func() {
		_, _ = in.ReadString('\n')
		close(hostGone)
	}()
	for {
		select {
		case sig := <-signals:
			if sig != syscall.SIGCHLD {
				return 0
			}
			reapOrphans()
		case <-hostGone:
			return 0
		}
	}
}

func reapOrphans() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// sandboxMounts gives the namespace its own /proc (its PID namespace's) and
// /run (containerd's sockets and state, the pods' network namespace files),
// and stops mounts made here from reaching the host.
func sandboxMounts() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("failed to make / a slave mount: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("failed to mount /proc: %w", err)
	}
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=755"); err != nil {
		return fmt.Errorf("failed to mount a tmpfs on /run: %w", err)
	}
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		return err
	}
	if dir := os.Getenv(envSandboxKubeletDir); dir != "" {
		if err := os.MkdirAll(kubeletRootDir, 0o700); err != nil {
			return err
		}
		if err := syscall.Mount(dir, kubeletRootDir, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("failed to bind %s at %s: %w", dir, kubeletRootDir, err)
		}
	}
	return nil
}

// sandboxNetwork configures the node's side: loopback, eth0 on the link,
// forwarding, bridged traffic through netfilter (kube-proxy's Service rules
// see pod-to-pod traffic on the bridge), a route for Service addresses
// (connections from the node itself are rewritten by kube-proxy after the
// route lookup), and the hermetic rule: pods may reach pods, the node and
// the host's end of the link, nothing else. There is no default route, so
// the node itself reaches nothing beyond the link either.
// hermeticTable is the nftables table of the hermetic rules (Dev.Reach adds
// exceptions to it).
const hermeticTable = "terrace-dev-hermetic"

func sandboxNetwork() error {
	link, nodeAddr, hostIP := os.Getenv(envSandboxLink), os.Getenv(envSandboxNodeAddr), os.Getenv(envSandboxHostIP)
	pods, svcs, block := os.Getenv(envSandboxPodCIDR), os.Getenv(envSandboxSvcCIDR), os.Getenv(envSandboxBlock)
	linkNet := strings.TrimSuffix(nodeAddr, "/30")
	linkNet = linkNet[:strings.LastIndex(linkNet, ".")] + ".0/30"
	steps := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "set", link, "name", "eth0"},
		{"ip", "addr", "add", nodeAddr, "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", svcs, "via", hostIP, "dev", "eth0"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("failed to run %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	for path, value := range map[string]string{
		"/proc/sys/net/ipv4/ip_forward":                 "1",
		"/proc/sys/net/bridge/bridge-nf-call-iptables":  "1",
		"/proc/sys/net/bridge/bridge-nf-call-ip6tables": "1",
		"/proc/sys/net/ipv4/conf/all/route_localnet":    "1",
	} {
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("failed to set %s: %w (the kernel needs br_netfilter)", path, err)
		}
	}
	rules := fmt.Sprintf(`table inet %[4]s {
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		ip saddr %[1]s ip daddr { %[1]s, %[2]s } accept
		ip saddr %[1]s counter drop comment "pod traffic bound off the dev cluster"
	}
	chain output {
		type filter hook output priority filter - 10; policy accept;
		ip daddr { 127.0.0.0/8, %[3]s } accept
		meta l4proto { tcp, udp, icmp } counter drop comment "node traffic bound off the dev cluster"
	}
}
`, pods, linkNet, block, hermeticTable)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to install the hermetic network rules: %v: %s", err, out)
	}
	return nil
}
