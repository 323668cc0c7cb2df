package devcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/terrace-dev/terrace/internal/devcluster/netpol"
)

// DevOptions configure a dev cluster: a control plane and a real node.
type DevOptions struct {
	// Dir holds everything: kubeconfig, cluster/ (control plane), node/
	// (containerd, kubelet, pod logs) and registry/. Wiped on start.
	// Required.
	Dir string
	// BinDir holds the control-plane binaries; FindBinDir when empty.
	BinDir string
	// NodeBinDir holds kubelet, kube-scheduler, kube-proxy, containerd, its
	// runc shim, coredns and pause; CNIBinDir the CNI plugins. From the
	// tools cache when empty (hack/tools/build.sh).
	NodeBinDir, CNIBinDir string
	// CRDDirs are installed with the control plane.
	CRDDirs []string
	// TerraceBinary is the terrace binary built from the checkout; when
	// set, the Terrace image is built from it and Tofu and pushed to the
	// cluster's registry under DevTag, its own version and every tag the
	// manifests name. Required when Install is set.
	TerraceBinary string
	// Tofu is the image's tofu binary; FindTofu when empty.
	Tofu string
	// ProviderMirror, when set, is a provider mirror directory baked into
	// the image (image.ProviderMirrorDir), as an air-gapped cluster's
	// runner image would carry one.
	ProviderMirror string
	// Shell, when set, is a static busybox the image gets as /bin/sh, for
	// modules whose local-exec provisioners run shell commands.
	Shell string
	// ImageTags are more tags the image is pushed under, such as those of
	// manifests the caller applies itself (ManifestImageTags).
	ImageTags []string
	// Install is a kustomization (config/default) applied once the node is
	// Ready, as `kubectl apply -k` would; StartDev waits until its
	// Deployments are Available. Nothing is installed when empty.
	Install string
	// NodeName is the Node's name (and the node's hostname); "terrace-dev"
	// when empty.
	NodeName string
	// Log receives progress; discarded when unset.
	Log logr.Logger
	// Profiling is passed to the control plane (Options.Profiling).
	Profiling bool
}

// Dev is a running dev cluster.
type Dev struct {
	Cluster *Cluster
	Node    *Node
	// KubeconfigPath is Dir/kubeconfig, an admin kubeconfig.
	KubeconfigPath string
	// Registry serves the node's images; Image is the Terrace image's
	// reference as the manifests name it (empty when nothing was
	// installed).
	Registry *Registry
	Image    string

	lock *os.File
	// stopEnforcer ends the NetworkPolicy enforcer; enforcerDone closes
	// when it has.
	stopEnforcer context.CancelFunc
	enforcerDone chan struct{}
}

// StartDev locks opts.Dir (one dev cluster per directory), checks that
// this machine can run a node, and starts the node's namespaces, the
// control plane, the registry, the node and the cluster DNS, then installs
// opts.Install. Whatever fails, what was started is stopped.
func StartDev(ctx context.Context, opts DevOptions) (d *Dev, err error) {
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	if opts.NodeName == "" {
		opts.NodeName = "terrace-dev"
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	if opts.NodeBinDir == "" {
		opts.NodeBinDir = filepath.Join(ToolsCacheDir(), "node-bin")
	}
	if opts.CNIBinDir == "" {
		opts.CNIBinDir = filepath.Join(ToolsCacheDir(), "cni-plugins-"+CNIPluginsVersion)
	}
	if err := CheckNodeRequirements(opts.NodeBinDir, opts.CNIBinDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", opts.Dir, err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	d = &Dev{lock: lock, KubeconfigPath: filepath.Join(opts.Dir, "kubeconfig")}
	defer func() {
		if err != nil {
			_ = d.Stop()
			d = nil
		}
	}()
	for _, sub := range []string{"node", "registry"} {
		if err := os.RemoveAll(filepath.Join(opts.Dir, sub)); err != nil {
			return d, fmt.Errorf("failed to clear %s: %w", sub, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(opts.Dir, "node"), 0o700); err != nil {
		return d, err
	}
	begin := time.Now()
	sb, err := startSandbox(ctx, filepath.Join(opts.Dir, "node"), opts.NodeName)
	if err != nil {
		return d, err
	}
	d.Node = &Node{name: opts.NodeName, dir: filepath.Join(opts.Dir, "node"), sandbox: sb}
	opts.Log.Info("node namespaces ready", "link", sb.net.HostIf, "hostIP", sb.net.HostIP, "nodeIP", sb.net.NodeIP, "pods", sb.net.PodCIDR, "services", sb.net.ServiceCIDR)

	if d.Registry, err = StartRegistry(filepath.Join(opts.Dir, "registry"), sb.net.HostIP.String()); err != nil {
		return d, err
	}
	imagesDone := make(chan error, 1)
	go func() { imagesDone <- d.Registry.pushNodeImages(ctx, opts.NodeBinDir) }()

	net := sb.net
	if d.Cluster, err = Start(ctx, Options{
		BinDir: opts.BinDir, Dir: filepath.Join(opts.Dir, "cluster"), CRDDirs: opts.CRDDirs,
		Log: opts.Log, Profiling: opts.Profiling, nodeNet: &net, nodeBinDir: opts.NodeBinDir,
	}); err != nil {
		return d, err
	}
	if err := copyFile(d.Cluster.KubeconfigPath, d.KubeconfigPath); err != nil {
		return d, err
	}
	if err := <-imagesDone; err != nil {
		return d, fmt.Errorf("failed to push the node's images: %w", err)
	}
	nodeCtx, cancel := context.WithTimeout(ctx, nodeStartTimeout)
	defer cancel()
	if err := d.Node.start(nodeCtx, d.Cluster, nodeOptions{
		binDir: opts.NodeBinDir, cniBinDir: opts.CNIBinDir, registry: d.Registry.NodeHost, log: opts.Log,
	}); err != nil {
		return d, err
	}
	opts.Log.Info("node ready", "node", opts.NodeName, "after", time.Since(begin).Round(time.Millisecond))
	d.startEnforcer(opts.Log)
	progress := func(msg string) { opts.Log.V(1).Info(msg) }
	if err := installCoreDNS(ctx, d.Cluster.Config, net.DNSServiceIP.String(), progress); err != nil {
		return d, fmt.Errorf("failed to install the cluster DNS: %w", err)
	}
	opts.Log.Info("cluster DNS ready", "after", time.Since(begin).Round(time.Millisecond))
	if err := d.install(ctx, opts, progress); err != nil {
		return d, err
	}
	if opts.Install != "" {
		opts.Log.Info("installed", "kustomization", opts.Install, "after", time.Since(begin).Round(time.Millisecond))
	}
	// Building the images held their layers (a few hundred MB) in memory;
	// nothing refers to them now, so give the memory back rather than
	// idle at the start's peak.
	debug.FreeOSMemory()
	return d, nil
}

// Stop stops the node (its pods go with its namespaces), the control plane
// and the registry, and releases the directory. Safe to call more than
// once.
func (d *Dev) Stop() error {
	var errs []error
	if d.stopEnforcer != nil {
		d.stopEnforcer()
		<-d.enforcerDone
		d.stopEnforcer = nil
	}
	if d.Node != nil {
		d.Node.stop()
		d.Node = nil
	}
	if d.Cluster != nil {
		if err := d.Cluster.Stop(); err != nil {
			errs = append(errs, err)
		}
		d.Cluster = nil
	}
	if d.Registry != nil {
		if err := d.Registry.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("registry: %w", err))
		}
		d.Registry = nil
	}
	if d.lock != nil {
		_ = d.lock.Close()
		d.lock = nil
	}
	return errors.Join(errs...)
}

// startEnforcer runs the NetworkPolicy enforcer (internal/devcluster/netpol)
// in this process until Stop: it compiles the cluster's policies to
// nftables rules and loads them into the node's network namespace, where
// pod traffic is forwarded. (kube-network-policies, the enforcer kind and
// others use, queues packets with nftables' queue expression, which this
// machine's kernel lacks.)
func (d *Dev) startEnforcer(log logr.Logger) {
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), log.WithName("netpol")))
	d.stopEnforcer, d.enforcerDone = cancel, make(chan struct{})
	initPid := strconv.Itoa(d.Node.sandbox.init.Process.Pid)
	go func() {
		defer close(d.enforcerDone)
		err := (&netpol.Enforcer{}).Run(ctx, d.Cluster.Config, func(ctx context.Context, ruleset string) error {
			cmd := exec.CommandContext(ctx, "nsenter", "--target", initPid, "--net", "--", "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(ruleset)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("failed to load the network policy rules: %v: %s", err, out)
			}
			return nil
		})
		if err != nil {
			log.Error(err, "the NetworkPolicy enforcer stopped")
		}
	}()
}

// CheckNodeRequirements says, in one line, the first thing this machine
// lacks to run the dev cluster's node, and how to get it.
func CheckNodeRequirements(nodeBinDir, cniBinDir string) error {
	if os.Geteuid() != 0 {
		return errors.New("terrace dev runs a real node (containerd, runc, network namespaces) and must run as root: use sudo")
	}
	for _, tool := range []string{"nsenter", "ip", "nft", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat("/usr/sbin/" + tool); err != nil {
				return fmt.Errorf("%s is missing: install Debian's util-linux, iproute2, nftables and runc (hack/install-deps.sh demo)", tool)
			}
		}
	}
	for _, bin := range []string{"kubelet", "kube-scheduler", "kube-proxy", "containerd", "containerd-shim-runc-v2", "coredns", "pause"} {
		if _, err := os.Stat(filepath.Join(nodeBinDir, bin)); err != nil {
			return fmt.Errorf("%s is missing from %s: run `make tools`", bin, nodeBinDir)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			return fmt.Errorf("the CNI plugin %s is missing from %s: run `make tools`", plugin, cniBinDir)
		}
	}
	filesystems, err := os.ReadFile("/proc/filesystems")
	if err != nil || !strings.Contains(string(filesystems), "overlay") {
		return errors.New("the kernel has no overlay filesystem, which containerd's snapshotter needs: load it with `modprobe overlay`")
	}
	for _, controller := range []string{"cpu", "memory", "pids"} {
		if _, err := os.Stat(filepath.Join(cgroupFS, controller)); err != nil {
			if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err != nil {
				return fmt.Errorf("no %s cgroup at %s: the kubelet needs the cpu, memory and pids cgroup controllers mounted", controller, cgroupFS)
			}
		}
	}
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		return errors.New("the kernel has no bridge netfilter (br_netfilter), which Service traffic between pods needs: load it with `modprobe br_netfilter`")
	}
	return nil
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, data, 0o600)
	}
	if err != nil {
		return fmt.Errorf("failed to copy %s to %s: %w", from, to, err)
	}
	return nil
}

// lockDir takes an exclusive lock on dir/lock, held while the file is open.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("another terrace dev is using %s (stop it, or pass another --dir)", dir)
	}
	return f, nil
}

// StartupTimeout is a generous bound for StartDev on a loaded machine.
const StartupTimeout = 2 * time.Minute

// Reach lets the node and its pods reach ip, an address of this host
// outside the cluster, such as another dev cluster's API server (the
// host's end of that cluster's link): a route to it over the link, and an
// exception in the hermetic rules. Every other address stays unreachable.
func (d *Dev) Reach(ip string) error {
	if net.ParseIP(ip).To4() == nil {
		return fmt.Errorf("%q is not an IPv4 address", ip)
	}
	n := d.Node.sandbox.net
	target := strconv.Itoa(d.Node.sandbox.init.Process.Pid)
	for _, step := range [][]string{
		{"ip", "route", "replace", ip + "/32", "via", n.HostIP.String(), "dev", "eth0"},
		{"nft", "insert", "rule", "inet", hermeticTable, "forward", "ip", "saddr", n.PodCIDR.String(), "ip", "daddr", ip, "accept"},
		{"nft", "insert", "rule", "inet", hermeticTable, "output", "ip", "daddr", ip, "accept"},
	} {
		args := append([]string{"--target", target, "--net", "--"}, step...)
		if out, err := exec.Command("nsenter", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("failed to run %s in the node's network: %v: %s", strings.Join(step, " "), err, out)
		}
	}
	return nil
}
