package devcluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Images the node needs before any pod runs; the dev cluster builds them
// and its registry serves them (every registry name resolves to it).
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	CoreDNSImage = "registry.k8s.io/coredns/coredns:" + CoreDNSVersion
)

// Node is the dev cluster's node: containerd (with runc), the kubelet and
// kube-proxy, run in the sandbox's namespaces.
type Node struct {
	name    string
	dir     string
	sandbox *sandbox
	procs   []*process
	// opts are those of the last start, for Dev.RebootNode.
	opts nodeOptions
}

type nodeOptions struct {
	// binDir holds kubelet, kube-proxy, containerd and its shim;
	// cniBinDir the CNI plugins.
	binDir, cniBinDir string
	// registry is host:port of the registry every image name resolves to.
	registry string
	log      logr.Logger
}

// Name is the Node's name.
func (n *Node) Name() string { return n.name }

// PodCIDR is the range pod addresses come from.
func (n *Node) PodCIDR() string { return n.sandbox.net.PodCIDR.String() }

// IP is the node's InternalIP.
func (n *Node) IP() string { return n.sandbox.net.NodeIP.String() }

// HostIP is the host's end of the node's link: what pods reach a process on
// the host at (a controller run as a process, a test's server).
func (n *Node) HostIP() string { return n.sandbox.net.HostIP.String() }

// LogDir holds the node's process logs (containerd, kubelet, kube-proxy)
// and, under pods/, every container's log.
func (n *Node) LogDir() string { return filepath.Join(n.dir, "logs") }

// PodsCPU is the CPU time every pod of the node has used so far (the
// cpuacct controller of the kubelet's cgroupRoot, which holds every pod's
// cgroup), or 0 when it cannot be read.
func (n *Node) PodsCPU() time.Duration {
	data, err := os.ReadFile(filepath.Join(cgroupFS, "cpuacct", n.sandbox.cgroupRoot(), "cpuacct.usage"))
	if err != nil {
		return 0
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return time.Duration(ns)
}

// Pids lists the node's processes still running, the sandbox's init first.
func (n *Node) Pids() []int {
	var pids []int
	if n.sandbox.alive() {
		pids = append(pids, n.sandbox.init.Process.Pid)
	}
	for _, p := range n.procs {
		if !p.exited() {
			pids = append(pids, p.Pid())
		}
	}
	return pids
}

// start starts containerd, the kubelet and kube-proxy in the node's sandbox
// and waits until the Node is Ready. What it started is in n.procs, for
// stop, whether it succeeded or not.
func (n *Node) start(ctx context.Context, c *Cluster, opts nodeOptions) error {
	n.opts = opts
	sb := n.sandbox
	for _, sub := range []string{"config", "logs", "containerd", "kubelet", "cni/net.d", "cni/ipam", "containerd/certs.d/_default"} {
		if err := os.MkdirAll(filepath.Join(n.dir, sub), 0o700); err != nil {
			return fmt.Errorf("failed to create the node's %s directory: %w", sub, err)
		}
	}
	if err := n.writeRuntimeConfig(opts); err != nil {
		return err
	}
	path := "PATH=" + opts.binDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	containerd, err := n.startProcess("containerd", filepath.Join(opts.binDir, "containerd"), []string{"--config", n.path("config/containerd.toml")}, path)
	if err != nil {
		return err
	}
	// The socket is in the sandbox's own /run, seen here through its init.
	socket := filepath.Join("/proc", strconv.Itoa(sb.init.Process.Pid), "root", "run/containerd/containerd.sock")
	if err := pollUntil(ctx, containerd, func(context.Context) (bool, error) {
		_, err := os.Stat(socket)
		return err == nil, nil
	}, "containerd's socket"); err != nil {
		return err
	}
	opts.log.Info("containerd ready")

	if err := n.writeKubeletConfig(c, opts); err != nil {
		return err
	}
	if err := sb.makeCgroupRoot(); err != nil {
		return err
	}
	kubelet, err := n.startProcess("kubelet", filepath.Join(opts.binDir, "kubelet"), []string{
		"--config=" + n.path("config/kubelet.yaml"),
		"--kubeconfig=" + n.path("config/kubelet.kubeconfig"),
		"--root-dir=" + kubeletRootDir, // n.path("kubelet"), bound there

		"--hostname-override=" + n.name,
		"--node-ip=" + sb.net.NodeIP.String(),
		"--v=1",
	}, path)
	if err != nil {
		return err
	}
	proxyKubeconfig := n.path("config/kube-proxy.kubeconfig")
	if err := c.writeClientKubeconfig(proxyKubeconfig, "system:kube-proxy"); err != nil {
		return err
	}
	if _, err := n.startProcess("kube-proxy", filepath.Join(opts.binDir, "kube-proxy"), []string{
		"--kubeconfig=" + proxyKubeconfig,
		"--proxy-mode=nftables",
		"--cluster-cidr=" + sb.net.PodCIDR.String(),
		"--hostname-override=" + n.name,
		// The node's namespace may not change the machine's conntrack table size.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address=127.0.0.1:10249",
		"--healthz-bind-address=127.0.0.1:10256",
	}, path); err != nil {
		return err
	}
	if err := n.waitReady(ctx, c, kubelet); err != nil {
		return err
	}
	return nil
}

func (n *Node) path(rel string) string { return filepath.Join(n.dir, rel) }

func (n *Node) startProcess(name, bin string, args []string, env ...string) (*process, error) {
	p, err := n.sandbox.command(name, bin, args, env, filepath.Join(n.dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	return p, nil
}

// stop ends the node's processes, kube-proxy first and containerd last,
// then the sandbox, which takes the containers with it.
func (n *Node) stop() {
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].stop(stopGrace)
	}
	n.procs = nil
	n.sandbox.stop()
}

// writeRuntimeConfig writes containerd's configuration, the registry
// redirection (every registry name is the dev registry, over plain HTTP on
// the link, so nothing is ever pulled from elsewhere) and the CNI network.
func (n *Node) writeRuntimeConfig(opts nodeOptions) error {
	containerd := fmt.Sprintf(`version = 3
root = %[1]q
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[2]q
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = %[3]q

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # Lowering a process's OOM score needs CAP_SYS_RESOURCE, which sandboxed
  # machines (this one included) may not grant: containers then keep at
  # least containerd's own score instead of failing to start.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[4]q]
    conf_dir = %[5]q

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, n.path("containerd/root"), PauseImage, n.path("containerd/certs.d"), opts.cniBinDir, n.path("cni/net.d"))
	hosts := fmt.Sprintf(`server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, opts.registry)
	net := n.sandbox.net
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "terrace-dev",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "hairpinMode": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, net.PodCIDR.String(), net.BridgeIP.String(), n.path("cni/ipam"))
	for path, data := range map[string]string{
		"config/containerd.toml":                 containerd,
		"containerd/certs.d/_default/hosts.toml": hosts,
		"cni/net.d/10-terrace-dev.conflist":      cni,
		"config/resolv.conf":                     "",
	} {
		if err := os.WriteFile(n.path(path), []byte(data), 0o600); err != nil {
			return fmt.Errorf("failed to write the node's %s: %w", path, err)
		}
	}
	return nil
}

// writeKubeletConfig issues the kubelet's identities (system:node:<name> to
// the API server, a serving certificate for the node's address) and writes
// its configuration: cgroupfs under the node's own cgroup root (this
// machine has cgroup v1), cluster DNS at kube-dns, API-server-checked
// authentication and authorization, and eviction thresholds low enough that
// a nearly full development disk does not evict the cluster's own pods.
func (n *Node) writeKubeletConfig(c *Cluster, opts nodeOptions) error {
	if err := c.writeClientKubeconfig(n.path("config/kubelet.kubeconfig"), "system:node:"+n.name, "system:nodes"); err != nil {
		return err
	}
	net := n.sandbox.net
	serving, err := c.ca.issue("system:node:"+n.name, []string{"system:nodes"}, []string{net.NodeIP.String(), n.name}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"config/ca.crt":       c.CACertPEM,
		"config/kubelet.crt":  serving.certPEM,
		"config/kubelet.key":  serving.keyPEM,
		"config/kubelet.yaml": nil,
	}
	files["config/kubelet.yaml"] = []byte(strings.Join([]string{
		"apiVersion: kubelet.config.k8s.io/v1beta1",
		"kind: KubeletConfiguration",
		"address: " + net.NodeIP.String(),
		"port: 10250",
		"readOnlyPort: 0",
		"healthzBindAddress: 127.0.0.1",
		"healthzPort: 10248",
		"authentication:",
		"  anonymous: {enabled: false}",
		"  webhook: {enabled: true}",
		"  x509: {clientCAFile: " + n.path("config/ca.crt") + "}",
		"authorization: {mode: Webhook}",
		"tlsCertFile: " + n.path("config/kubelet.crt"),
		"tlsPrivateKeyFile: " + n.path("config/kubelet.key"),
		"cgroupDriver: cgroupfs",
		"cgroupRoot: /" + n.sandbox.cgroupRoot(),
		"failCgroupV1: false",
		"failSwapOn: false",
		"containerRuntimeEndpoint: unix:///run/containerd/containerd.sock",
		"clusterDomain: cluster.local",
		"clusterDNS: [" + net.DNSServiceIP.String() + "]",
		"resolvConf: " + n.path("config/resolv.conf"),
		"podLogsDir: " + n.path("logs/pods"),
		"maxPods: 250",
		"serializeImagePulls: false",
		"evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}",
		// A pressure condition (a full disk) is lifted 30 s after it
		// passes, not the default 5 minutes: a dev node recovers while
		// someone waits on it (the chaos harness's disk-full fault).
		"evictionPressureTransitionPeriod: 30s",
		"imageGCHighThresholdPercent: 100",
		"imageGCLowThresholdPercent: 99",
		"",
	}, "\n"))
	for path, data := range files {
		if err := os.WriteFile(n.path(path), data, 0o600); err != nil {
			return fmt.Errorf("failed to write the node's %s: %w", path, err)
		}
	}
	return nil
}

// waitReady waits until the Node is registered and Ready.
func (n *Node) waitReady(ctx context.Context, c *Cluster, kubelet *process) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	var last string
	err = pollUntil(ctx, kubelet, func(ctx context.Context) (bool, error) {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = cond.Reason + ": " + cond.Message
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}, "node "+n.name+" to be Ready")
	if err != nil {
		return fmt.Errorf("%w (last seen: %s); kubelet log:\n%s", err, last, kubelet.lastLogLines(20))
	}
	return nil
}

// nodeStartTimeout bounds the node's start after the control plane's.
const nodeStartTimeout = 90 * time.Second
