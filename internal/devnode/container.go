package devnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Environment variables devnode gives every process (besides the pod's own).
const (
	// EnvPodRoot is the host directory that stands for the container's "/":
	// every volumeMount appears at $TERRACE_POD_ROOT<mountPath>.
	EnvPodRoot = "TERRACE_POD_ROOT"
	// EnvPodIP is the pod's loopback address; servers must bind it.
	EnvPodIP = "POD_IP"
	// EnvPodName and EnvPodNamespace name the pod.
	EnvPodName      = "POD_NAME"
	EnvPodNamespace = "POD_NAMESPACE"
)

// serviceAccountMountPath is where Kubernetes mounts the pod's API credentials.
const serviceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// Restart back-off: shorter than the kubelet's 10 s–5 min so a crash loop on
// a laptop or in a test is visible quickly.
const (
	initialBackoff = time.Second
	maxBackoff     = 30 * time.Second
	backoffReset   = time.Minute
)

// containerPaths are one container's directories on the host.
type containerPaths struct {
	dir  string // <pod dir>/containers/<name>
	root string // dir/root, the container's "/"
}

func (w *podWorker) containerPaths(name string) containerPaths {
	dir := filepath.Join(w.podDir, "containers", name)
	return containerPaths{dir: dir, root: filepath.Join(dir, "root")}
}

// processSpec is everything needed to start (or exec into) a container.
type processSpec struct {
	exe     string // the program on the host
	args    []string
	env     []string
	dir     string
	root    string
	mapper  pathMapper
	imageID string // repository@digest of a pulled image
	// lookup finds an exec probe's program: in the image, or the terrace
	// binary in host-binary mode.
	lookup func(argv0 string) (string, error)
}

// execCommand builds an exec probe's command inside a running container;
// nil when its program is not in the container.
func (w *podWorker) execCommand(spec *processSpec) func(ctx context.Context, command []string) *exec.Cmd {
	return func(ctx context.Context, command []string) *exec.Cmd {
		exe, err := spec.lookup(command[0])
		if err != nil {
			return nil
		}
		args := make([]string, 0, len(command)-1)
		for _, a := range command[1:] {
			args = append(args, spec.mapper.rewrite(a))
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Env, cmd.Dir = spec.env, spec.dir
		return cmd
	}
}

// runningProcess is one started container process.
type runningProcess struct {
	cmd       *exec.Cmd
	startedAt metav1.Time
	exited    chan struct{}
	waitErr   error
	logPath   string
}

func (w *podWorker) startProcess(c *corev1.Container, spec *processSpec, restart int32) (*runningProcess, error) {
	logPath := w.logPath(c.Name, restart)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("failed to create log directory: %w", err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("failed to open log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(spec.exe, spec.args...)
	cmd.Env, cmd.Dir = spec.env, spec.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start %s: %w", spec.exe, err)
	}
	p := &runningProcess{cmd: cmd, startedAt: metav1.Now(), exited: make(chan struct{}), logPath: logPath}
	go func() {
		p.waitErr = cmd.Wait()
		// The container is over when its main process is: anything it
		// left in its process group (tofu, providers) goes too.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		close(p.exited)
	}()
	return p, nil
}

// Image pull back-off: the kubelet's starts at 10 s and grows to 5 min;
// shorter here, as for restarts.
const initialPullBackoff = 5 * time.Second

// backOffPull reports a failed pull as the kubelet does, ErrImagePull at
// once, then ImagePullBackOff until the next attempt, and waits; it
// reports whether the worker halted meanwhile.
func (w *podWorker) backOffPull(c *corev1.Container, st *containerState, err *pullError, backoff *time.Duration) bool {
	w.node.log.Info("failed to pull image", "pod", w.key, "container", c.Name, "image", c.Image, "error", err.message)
	w.update(func(*podState) { st.waitingReason, st.waitingMessage = err.reason, err.message })
	if w.wait(2 * time.Second) {
		return true
	}
	if err.reason == ReasonErrImagePull {
		w.update(func(*podState) {
			st.waitingReason = ReasonImagePullBackOff
			st.waitingMessage = fmt.Sprintf("Back-off pulling image %q: %s", c.Image, err.message)
		})
	}
	halted := w.wait(*backoff)
	*backoff = min(*backoff*2, maxBackoff)
	return halted
}

// terminate sends SIGTERM to the process group and SIGKILL at deadline.
func (p *runningProcess) terminate(deadline time.Time) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// termination describes how the process ended, in the kubelet's terms: a
// signal is reported as 128+signal.
func (p *runningProcess) termination(c *corev1.Container, root string) *corev1.ContainerStateTerminated {
	code := 0
	if p.waitErr != nil {
		code = -1
		var exitErr *exec.ExitError
		if errors.As(p.waitErr, &exitErr) {
			if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			} else {
				code = exitErr.ExitCode()
			}
		}
	}
	t := &corev1.ContainerStateTerminated{
		ExitCode:    int32(code),
		Reason:      "Completed",
		StartedAt:   p.startedAt,
		FinishedAt:  metav1.Now(),
		ContainerID: "devnode://" + strconv.Itoa(p.cmd.Process.Pid),
	}
	if code != 0 {
		t.Reason = "Error"
	}
	t.Message = terminationMessage(c, root, code, p.logPath)
	return t
}

// terminationMessage reads the container's terminationMessagePath (under
// its root) and, with FallbackToLogsOnError, the log's tail after a failure.
func terminationMessage(c *corev1.Container, root string, code int, logPath string) string {
	path := c.TerminationMessagePath
	if path == "" {
		path = corev1.TerminationMessagePathDefault
	}
	if data, err := os.ReadFile(filepath.Join(root, filepath.Clean("/"+path))); err == nil && len(data) > 0 {
		return truncateMessage(string(data), 4096)
	}
	if c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && code != 0 {
		return truncateMessage(tailLines(logPath, 80), 2048)
	}
	return ""
}

func truncateMessage(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return s[len(s)-limit:]
}

// superviseContainer runs one container until it is final: it restarts it
// according to the pod's restart policy with back-off, runs its probes and
// stops it when the worker halts. It returns the final termination.
func (w *podWorker) superviseContainer(ctx context.Context, c *corev1.Container, st *containerState, restartPolicy corev1.RestartPolicy, probes bool) *corev1.ContainerStateTerminated {
	backoff, pullBackoff := initialBackoff, initialPullBackoff
	for {
		if w.halted() {
			return w.setFinal(st)
		}
		pod := w.latest()
		spec, err := w.prepare(ctx, pod, c)
		var proc *runningProcess
		if err == nil {
			proc, err = w.startProcess(c, spec, st.restartCount)
		}
		if err != nil {
			var unsupported *unsupportedError
			if errors.As(err, &unsupported) {
				w.fail(unsupported.reason, unsupported.message)
				w.setFinal(st)
				return nil
			}
			var pullErr *pullError
			if errors.As(err, &pullErr) {
				if w.backOffPull(c, st, pullErr, &pullBackoff) {
					return w.setFinal(st)
				}
				continue
			}
			reason := "RunContainerError"
			var cfgErr *configError
			if errors.As(err, &cfgErr) {
				reason = "CreateContainerConfigError"
			}
			w.update(func(*podState) { st.waitingReason, st.waitingMessage = reason, err.Error() })
			w.wait(2 * time.Second)
			continue
		}

		pullBackoff = initialPullBackoff
		w.update(func(*podState) {
			st.imageID = spec.imageID
			st.runningSince, st.pid = &proc.startedAt, proc.cmd.Process.Pid
			st.waitingReason, st.waitingMessage = "", ""
			st.started = c.StartupProbe == nil
			st.ready = st.started && c.ReadinessProbe == nil
		})
		runCtx, cancelProbes := context.WithCancel(ctx)
		kill := make(chan string, 1)
		if probes {
			w.startProbes(runCtx, c, st, spec, kill)
		}
		var killed string
		select {
		case <-proc.exited:
		case <-w.haltCh:
			proc.terminate(w.haltDeadline())
		case killed = <-kill:
			w.node.log.Info("restarting container", "pod", w.key, "container", c.Name, "reason", killed)
			proc.terminate(time.Now().Add(terminationGrace(pod)))
		}
		cancelProbes()
		<-proc.exited
		term := proc.termination(c, spec.root)
		if killed != "" && term.Message == "" {
			term.Message = killed
		}
		ranFor := time.Since(proc.startedAt.Time)
		final := w.halted() || restartPolicy == corev1.RestartPolicyNever ||
			(restartPolicy == corev1.RestartPolicyOnFailure && term.ExitCode == 0)
		w.update(func(*podState) {
			st.terminated(term)
			st.final = final
			if !final {
				st.waitingReason = "CrashLoopBackOff"
				st.waitingMessage = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", backoff, c.Name, pod.Name)
			}
		})
		if final {
			return term
		}
		if ranFor > backoffReset {
			backoff = initialBackoff
		}
		if w.wait(backoff) {
			return w.setFinal(st)
		}
		backoff = min(backoff*2, maxBackoff)
		w.update(func(*podState) { st.restartCount++ })
	}
}

// startProbes runs the container's probes for one run: readiness sets
// ready, a failed liveness or startup probe asks for a restart on kill.
func (w *podWorker) startProbes(ctx context.Context, c *corev1.Container, st *containerState, spec *processSpec, kill chan<- string) {
	target := probeTarget{podIP: w.podIP(), container: c, exec: w.execCommand(spec)}
	requestKill := func(msg string) {
		select {
		case kill <- msg:
		default:
		}
	}
	afterStartup := func() {
		if c.ReadinessProbe != nil {
			go probeLoop(ctx, readinessProbe, c.ReadinessProbe, target, func(ok bool, msg string) {
				w.update(func(*podState) { st.ready = ok })
				if !ok {
					w.node.log.V(1).Info("container not ready", "pod", w.key, "container", c.Name, "reason", msg)
				}
			})
		}
		if c.LivenessProbe != nil {
			go probeLoop(ctx, livenessProbe, c.LivenessProbe, target, func(ok bool, msg string) {
				if !ok {
					requestKill(msg)
				}
			})
		}
	}
	if c.StartupProbe == nil {
		afterStartup()
		return
	}
	startupCtx, done := context.WithCancel(ctx)
	go probeLoop(startupCtx, startupProbe, c.StartupProbe, target, func(ok bool, msg string) {
		if !ok {
			requestKill(msg)
			return
		}
		done()
		w.update(func(*podState) {
			st.started = true
			st.ready = c.ReadinessProbe == nil
		})
		afterStartup()
	})
}

func terminationGrace(pod *corev1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return corev1.DefaultTerminationGracePeriodSeconds * time.Second
}

// tailLines returns up to n final lines of a log file (at most 64 KiB read).
func tailLines(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	const window = 64 << 10
	offset := max(info.Size()-window, 0)
	buf := make([]byte, info.Size()-offset)
	if _, err := f.ReadAt(buf, offset); err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
