package devcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sandbox is the node's side of a dev cluster: new PID, mount, network and
// UTS namespaces whose PID 1 is sandboxInit, joined to the host by a veth
// link. The node's processes (containerd, the kubelet, kube-proxy) run in
// it through nsenter, and containerd's shims and containers with them, so
// that the PID namespace's end takes every one of them, and the network
// namespace's end takes the link, the bridge, the pods' addresses and
// kube-proxy's rules: nothing of the node outlives it on the host but empty
// cgroup directories, which the next start removes.
type sandbox struct {
	net      network
	hostname string
	init     *exec.Cmd
	initDone chan struct{}
	// hostEnd is the init's stdin: closing it stops the init.
	hostEnd io.WriteCloser
	logPath string
	// slotLock is the slot's lock file, held (flock) from the claim to
	// the end of stop: the link vanishes with the namespace, before stop
	// has removed the slot's cgroups, and another dev cluster must not
	// take the slot meanwhile (stop would remove its link and cgroups,
	// which have the same names).
	slotLock *os.File
}

// sandboxCgroupPrefix names the cgroups the node's kubelet creates pods
// under (cgroupRoot /terrace-dev-<slot>), in every hierarchy.
const sandboxCgroupPrefix = "terrace-dev-"

// startSandbox takes the first free address slot, starts the init in new
// namespaces, hands it its end of the link and configures the host's end:
// its address and the routes to the pod and Service ranges.
func startSandbox(ctx context.Context, dir, hostname string) (*sandbox, error) {
	removeStaleCgroups()
	slots, err := freeSlots()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for _, slot := range slots {
		lock, err := lockSlot(slot)
		if err != nil {
			lastErr = err
			continue
		}
		n := networkForSlot(slot)
		nodeEnd := n.HostIf + "n"
		// The link's creation is what claims the slot: it fails when
		// another dev cluster created it first.
		if err := runIP("link", "add", n.HostIf, "type", "veth", "peer", "name", nodeEnd); err != nil {
			_ = lock.Close()
			lastErr = err
			continue
		}
		s, err := launchSandbox(ctx, dir, hostname, n, nodeEnd)
		if err != nil {
			_ = runIP("link", "del", n.HostIf)
			_ = lock.Close()
			return nil, err
		}
		s.slotLock = lock
		return s, nil
	}
	return nil, fmt.Errorf("failed to claim an address slot for the dev cluster: %w", lastErr)
}

func launchSandbox(ctx context.Context, dir, hostname string, n network, nodeEnd string) (*sandbox, error) {
	if err := os.MkdirAll(filepath.Join(dir, "kubelet"), 0o700); err != nil {
		return nil, fmt.Errorf("failed to create the kubelet's directory: %w", err)
	}
	s := &sandbox{net: n, hostname: hostname, initDone: make(chan struct{}), logPath: filepath.Join(dir, "sandbox-init.log")}
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open the sandbox log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{sandboxInitName}
	cmd.Env = append(os.Environ(),
		envSandboxHostname+"="+hostname,
		envSandboxLink+"="+nodeEnd,
		envSandboxNodeAddr+"="+n.NodeIP.String()+"/"+strconv.Itoa(n.LinkPrefix),
		envSandboxHostIP+"="+n.HostIP.String(),
		envSandboxPodCIDR+"="+n.PodCIDR.String(),
		envSandboxSvcCIDR+"="+n.ServiceCIDR.String(),
		envSandboxBlock+"="+n.block().String(),
		envSandboxKubeletDir+"="+filepath.Join(dir, "kubelet"),
	)
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS,
		// Its death ends the PID namespace: this process's death ends it.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true,
	}
	if s.hostEnd, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start the node's namespaces (terrace dev must run as root): %w", err)
	}
	s.init = cmd
	go func() {
		_ = cmd.Wait()
		close(s.initDone)
	}()
	lines := bufio.NewScanner(stdout)
	expect := func(want string) error {
		got := make(chan bool, 1)
		go func() { got <- lines.Scan() && lines.Text() == want }()
		select {
		case ok := <-got:
			if ok {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for the node's namespaces: %w", ctx.Err())
		}
		<-s.initDone
		return fmt.Errorf("the node's namespaces failed to start: %s", tailFile(s.logPath, 10))
	}
	fail := func(err error) (*sandbox, error) {
		s.stop()
		return nil, err
	}
	if err := expect("started"); err != nil {
		return fail(err)
	}
	if err := runIP("link", "set", nodeEnd, "netns", strconv.Itoa(cmd.Process.Pid)); err != nil {
		return fail(err)
	}
	if _, err := io.WriteString(s.hostEnd, "link\n"); err != nil {
		return fail(fmt.Errorf("failed to hand over the link: %w", err))
	}
	if err := expect("ready"); err != nil {
		return fail(err)
	}
	steps := [][]string{
		{"addr", "add", n.HostIP.String() + "/" + strconv.Itoa(n.LinkPrefix), "dev", n.HostIf},
		{"link", "set", n.HostIf, "up"},
		{"route", "add", n.PodCIDR.String(), "via", n.NodeIP.String(), "dev", n.HostIf},
		{"route", "add", n.ServiceCIDR.String(), "via", n.NodeIP.String(), "dev", n.HostIf},
	}
	for _, step := range steps {
		if err := runIP(step...); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// command runs bin in the sandbox's namespaces: nsenter forks it into the
// PID namespace, in the caller's process group, so process.stop's signal to
// the group reaches it.
func (s *sandbox) command(name, bin string, args []string, env []string, logPath string) (*process, error) {
	nsArgs := []string{"--target", strconv.Itoa(s.init.Process.Pid), "--mount", "--net", "--pid", "--uts", "--", bin}
	return startProcessEnv(name, "nsenter", append(nsArgs, args...), env, logPath)
}

// alive reports whether the sandbox's init still runs.
func (s *sandbox) alive() bool {
	select {
	case <-s.initDone:
		return false
	default:
		return true
	}
}

// stop ends the init (and with it every process in the namespaces), waits
// for the link to go with the network namespace, and removes the node's
// cgroups.
func (s *sandbox) stop() {
	if s.init != nil && s.alive() {
		_ = s.hostEnd.Close()
		_ = s.init.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.initDone:
		case <-time.After(5 * time.Second):
			_ = s.init.Process.Kill()
			<-s.initDone
		}
	}
	// The kernel frees the namespace once its last process is reaped;
	// the link goes with it. Delete it in case something still pins it.
	deadline := time.Now().Add(5 * time.Second)
	for linkExists(s.net.HostIf) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if linkExists(s.net.HostIf) {
		_ = runIP("link", "del", s.net.HostIf)
	}
	removeCgroups(s.cgroupRoot())
	if s.slotLock != nil {
		_ = s.slotLock.Close() // the slot is free from here
		s.slotLock = nil
	}
}

// slotLockDir holds a lock file per address slot (lockSlot).
var slotLockDir = filepath.Join(os.TempDir(), "terrace-dev-slots")

// lockSlot takes the slot's lock, or fails at once when another dev
// cluster holds it (one running, or one still cleaning up). The kernel
// drops the lock when its holder dies, kill -9 included.
func lockSlot(slot int) (*os.File, error) {
	if err := os.MkdirAll(slotLockDir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", slotLockDir, err)
	}
	f, err := os.OpenFile(filepath.Join(slotLockDir, strconv.Itoa(slot)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("address slot %d is held by another dev cluster: %w", slot, err)
	}
	return f, nil
}

// slotHeld says whether a live dev cluster holds the slot's lock.
func slotHeld(slot int) bool {
	f, err := lockSlot(slot)
	if err != nil {
		return true
	}
	_ = f.Close()
	return false
}

// cgroupRoot is the kubelet's cgroupRoot for this node.
func (s *sandbox) cgroupRoot() string {
	return sandboxCgroupPrefix + strconv.Itoa(s.net.Slot)
}

// makeCgroupRoot creates the node's cgroup in every hierarchy, which the
// kubelet requires of its cgroupRoot. A new cpuset is empty until given its
// parent's CPUs and memory nodes.
func (s *sandbox) makeCgroupRoot() error {
	hierarchies, err := os.ReadDir(cgroupFS)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", cgroupFS, err)
	}
	for _, h := range hierarchies {
		parent := filepath.Join(cgroupFS, h.Name())
		if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
			continue // not a hierarchy (a symlink such as cpu,cpuacct)
		}
		dir := filepath.Join(parent, s.cgroupRoot())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("failed to create the node's cgroup %s: %w", dir, err)
		}
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			if value, err := os.ReadFile(filepath.Join(parent, file)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, file), value, 0o644); err != nil {
					return fmt.Errorf("failed to set %s of %s: %w", file, dir, err)
				}
			}
		}
	}
	return nil
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

func runIP(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("failed to run ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

const cgroupFS = "/sys/fs/cgroup"

// removeStaleCgroups removes the cgroups of dev clusters that are gone
// (killed before they could clean up): those whose link no longer exists.
func removeStaleCgroups() {
	hierarchies, _ := os.ReadDir(cgroupFS)
	for _, h := range hierarchies {
		entries, _ := os.ReadDir(filepath.Join(cgroupFS, h.Name()))
		for _, e := range entries {
			slot, ok := strings.CutPrefix(e.Name(), sandboxCgroupPrefix)
			if !ok || !e.IsDir() {
				continue
			}
			n, err := strconv.Atoi(slot)
			if err == nil && !linkExists("tdev"+slot) && !slotHeld(n) {
				removeCgroups(e.Name())
			}
		}
	}
}

// removeCgroups removes the cgroup tree root in every hierarchy, deepest
// first, killing anything still in it (nothing, once the sandbox is gone).
func removeCgroups(root string) {
	hierarchies, _ := os.ReadDir(cgroupFS)
	for _, h := range hierarchies {
		top := filepath.Join(cgroupFS, h.Name(), root)
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			killCgroup(dirs[i])
			if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				// A process was still exiting: try once more.
				time.Sleep(100 * time.Millisecond)
				_ = syscall.Rmdir(dirs[i])
			}
		}
	}
}

func killCgroup(dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
