//go:build linux

package netpol

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// helperEnv makes the test binary a helper inside a network namespace:
// "serve" listens on the addresses in listenEnv and echoes lines back;
// "client" dials and pings on the commands it reads from stdin.
const (
	helperEnv = "TERRACE_NETPOL_TEST_HELPER"
	listenEnv = "TERRACE_NETPOL_TEST_LISTEN"
	// dialTimeout bounds a dial whose SYN the rules drop.
	dialTimeout = 1500 * time.Millisecond
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "serve":
		serveHelper()
	case "client":
		clientHelper()
	}
	os.Exit(0)
}

// serveHelper echoes lines on every address of listenEnv until its stdin
// closes.
func serveHelper() {
	for _, addr := range strings.Split(os.Getenv(listenEnv), ",") {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("fail", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = io.Copy(c, c) }()
			}
		}()
	}
	fmt.Println("listening")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// clientHelper answers "dial ADDR" with "ok N" (the connection's number) or
// "fail ...", and "ping N" with "ok" when connection N echoes a line.
func clientHelper() {
	var conns []net.Conn
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "dial":
			c, err := net.DialTimeout("tcp", arg, dialTimeout)
			if err != nil {
				fmt.Println("fail", err)
				continue
			}
			conns = append(conns, c)
			fmt.Println("ok", len(conns)-1)
		case "ping":
			i, err := strconv.Atoi(arg)
			if err != nil || i >= len(conns) {
				fmt.Println("fail no connection", arg)
				continue
			}
			c := conns[i]
			_ = c.SetDeadline(time.Now().Add(dialTimeout))
			line, err := "", error(nil)
			if _, err = io.WriteString(c, "ping\n"); err == nil {
				line, err = bufio.NewReader(c).ReadString('\n')
			}
			if err != nil || line != "ping\n" {
				fmt.Println("fail", err)
				continue
			}
			fmt.Println("ok")
		}
	}
}

// helper is a helper process in a network namespace, driven line by line.
type helper struct {
	name  string
	in    io.WriteCloser
	lines chan string
}

func startHelper(t *testing.T, netns, name, mode string, env ...string) *helper {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", netns, self)
	cmd.Env = append(os.Environ(), append(env, helperEnv+"="+mode)...)
	cmd.Stderr = os.Stderr
	h := &helper{name: name, lines: make(chan string, 16)}
	if h.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("failed to start the %s helper: %v", name, err)
	}
	t.Cleanup(func() {
		_ = h.in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			h.lines <- s.Text()
		}
		close(h.lines)
	}()
	if first := h.read(t); first != "listening" && first != "ready" {
		t.Fatalf("the %s helper did not start: %s", name, first)
	}
	return h
}

func (h *helper) read(t *testing.T) string {
	t.Helper()
	select {
	case line, ok := <-h.lines:
		if !ok {
			t.Fatalf("the %s helper exited", h.name)
		}
		return line
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s helper did not answer within 10s", h.name)
		return ""
	}
}

func (h *helper) do(t *testing.T, command string) string {
	t.Helper()
	if _, err := io.WriteString(h.in, command+"\n"); err != nil {
		t.Fatalf("failed to talk to the %s helper: %v", h.name, err)
	}
	return h.read(t)
}

// dial opens a connection from h to addr and reports whether it was
// accepted, with its number for ping.
func (h *helper) dial(t *testing.T, addr string) (string, bool) {
	t.Helper()
	answer := h.do(t, "dial "+addr)
	id, ok := strings.CutPrefix(answer, "ok ")
	return id, ok
}

func (h *helper) expectDial(t *testing.T, addr string, want bool) {
	t.Helper()
	if _, got := h.dial(t, addr); got != want {
		t.Errorf("%s dialling %s: connected=%v, want %v", h.name, addr, got, want)
	}
}

func (h *helper) expectPing(t *testing.T, id string) {
	t.Helper()
	if answer := h.do(t, "ping "+id); answer != "ok" {
		t.Errorf("%s's established connection %s: %s", h.name, id, answer)
	}
}

// requireNetAdmin fails a test that lacks root or the tools: the README's
// requirements include root, and make test installs the tools
// (hack/install-deps.sh), so their absence is a broken set-up, not a reason
// to pass without testing.
func requireNetAdmin(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root to create network namespaces: run the tests as root, as make test requires")
	}
	for _, tool := range []string{"ip", "nft", "nsenter", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s (hack/install-deps.sh test installs it): %v", tool, err)
		}
	}
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// addNetns creates a network namespace deleted when the test ends.
func addNetns(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("cannot create network namespaces here: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("failed to delete network namespace %s: %v: %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
}

// nsenterApply loads a ruleset in the network namespace at path, as the
// dev cluster does in its node's.
func nsenterApply(path string) func(ctx context.Context, ruleset string) error {
	return func(ctx context.Context, ruleset string) error {
		cmd := exec.CommandContext(ctx, "nsenter", "--net="+path, "--", "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(ruleset)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("failed to load the network policy rules: %v: %s", err, out)
		}
		return nil
	}
}

// TestRulesetOnABridge builds a node in miniature: a bridge in its own
// network namespace (the node) and three pods, each a network namespace
// on a veth port of the bridge, with bridged traffic through netfilter;
// then it loads compiled rulesets into the node and shows with real TCP
// connections what they let through.
func TestRulesetOnABridge(t *testing.T) {
	requireNetAdmin(t)
	id := fmt.Sprintf("tnp%05d", rand.IntN(100000))
	subnet := fmt.Sprintf("10.250.%d", rand.IntN(256))
	node := id + "-node"
	addNetns(t, node)
	run(t, "ip", "-n", node, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", node, "addr", "add", subnet+".1/24", "dev", "br0")
	run(t, "ip", "-n", node, "link", "set", "br0", "up")
	run(t, "ip", "netns", "exec", node, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1")

	type podNS struct {
		name, netns, ip string
		labels          map[string]string
	}
	pods := []podNS{
		{name: "server", ip: subnet + ".2", labels: map[string]string{"app": "server"}},
		{name: "client", ip: subnet + ".3", labels: map[string]string{"app": "client"}},
		{name: "other", ip: subnet + ".4", labels: map[string]string{"app": "other"}},
	}
	var clusterPods []corev1.Pod
	for i := range pods {
		p := &pods[i]
		p.netns = id + "-" + p.name
		addNetns(t, p.netns)
		port := "veth" + strconv.Itoa(i)
		run(t, "ip", "-n", node, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", p.netns)
		run(t, "ip", "-n", node, "link", "set", port, "master", "br0", "up")
		run(t, "ip", "-n", p.netns, "addr", "add", p.ip+"/24", "dev", "eth0")
		run(t, "ip", "-n", p.netns, "link", "set", "eth0", "up")
		clusterPods = append(clusterPods, testPod("shop", p.name, p.ip, p.labels, containerPort("http", 80, tcp)))
	}
	namespaces := []corev1.Namespace{testNamespace("shop", nil)}
	server, serverIP := pods[0], pods[0].ip
	startHelper(t, server.netns, "server", "serve", listenEnv+"="+serverIP+":80,"+serverIP+":8080")
	startHelper(t, pods[2].netns, "other's server", "serve", listenEnv+"="+pods[2].ip+":80")
	client := startHelper(t, pods[1].netns, "client", "client")
	other := startHelper(t, pods[2].netns, "other", "client")
	nodeClient := startHelper(t, node, "node", "client")

	apply := nsenterApply(filepath.Join("/run/netns", node))
	load := func(policies ...networkingv1.NetworkPolicy) {
		t.Helper()
		if err := apply(t.Context(), Compile(clusterPods, namespaces, policies)); err != nil {
			t.Fatal(err)
		}
	}

	// No policy: everyone reaches the server.
	load()
	client.expectDial(t, serverIP+":80", true)
	other.expectDial(t, serverIP+":80", true)
	established, ok := client.dial(t, serverIP+":80")
	if !ok {
		t.Fatalf("client could not connect to the server without a policy")
	}
	client.expectPing(t, established)

	// The server admits clients on its named port http.
	fromClients := testPolicy("shop", "server-from-clients", networkingv1.NetworkPolicySpec{
		PodSelector: *sel("app", "server"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
			Ports: []networkingv1.NetworkPolicyPort{port(tcp, "http")},
		}},
	})
	load(fromClients)
	client.expectDial(t, serverIP+":80", true)
	client.expectDial(t, serverIP+":8080", false)
	other.expectDial(t, serverIP+":80", false)

	// A default deny cuts new connections, not established ones, and not
	// the node's own (the kubelet's probes).
	deny := testPolicy("shop", "deny", networkingv1.NetworkPolicySpec{PodSelector: *sel(), PolicyTypes: allowIngress})
	load(deny)
	client.expectDial(t, serverIP+":80", false)
	client.expectPing(t, established)
	nodeClient.expectDial(t, serverIP+":80", true)

	// Egress: the client may reach the server's http port and nothing else.
	toServer := testPolicy("shop", "client-to-server", networkingv1.NetworkPolicySpec{
		PodSelector: *sel("app", "client"), PolicyTypes: allowEgress,
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "server")}},
			Ports: []networkingv1.NetworkPolicyPort{port(tcp, "http")},
		}},
	})
	load(toServer)
	client.expectDial(t, serverIP+":80", true)
	client.expectDial(t, pods[2].ip+":80", false)
	other.expectDial(t, serverIP+":8080", true)
	client.expectPing(t, established)
}

// TestRulesetsLoad loads every ruleset the semantic tests compile, and one
// for 2,000 pods, into a fresh network namespace, twice: nft accepts them,
// and the second load replaces the first.
func TestRulesetsLoad(t *testing.T) {
	requireNetAdmin(t)
	dir := t.TempDir()
	rulesets := map[string]string{}
	for _, tc := range compileCases {
		rulesets[tc.name] = Compile(testPods(), testNamespaces(), tc.policies)
	}
	pods, namespaces, policies := scaleCluster(1000)
	rulesets["1000 servers and 1000 clients"] = Compile(pods, namespaces, policies)
	for name, ruleset := range rulesets {
		path := filepath.Join(dir, "ruleset.nft")
		if err := os.WriteFile(path, []byte(ruleset), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out, err := exec.Command("unshare", "--net", "--", "sh", "-c", `nft -f "$1" && nft -f "$1" && nft list table inet `+Table, "sh", path).CombinedOutput()
		if err != nil {
			t.Errorf("%s: nft refused the ruleset: %v: %s\n%s", name, err, out, ruleset)
			continue
		}
		t.Logf("%s: %d bytes loaded twice in %v", name, len(ruleset), time.Since(start).Round(time.Millisecond))
	}
}
