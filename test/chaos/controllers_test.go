package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// replica is one `terrace controller` process, restarted when it exits as
// a Deployment's pod would be.
type replica struct {
	name    string
	logPath string
	args    []string
	health  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	logFrom int64 // where the current process's log starts
	starts  int
}

// controllers supervises the replicas.
type controllers struct {
	replicas []*replica
	stopping atomic.Bool
	wg       sync.WaitGroup
}

func startControllers(t *testing.T, e *env, n int) *controllers {
	t.Helper()
	cs := &controllers{}
	for i := range n {
		// The servers listen on the host's end of the node's link, as
		// the proxies in front of them do; the health endpoint is the
		// harness's alone.
		ports := append(hostPorts(t, e.hostIP, 2), freePorts(t, 1)...)
		r := &replica{
			name:    fmt.Sprintf("controller-%d", i),
			logPath: filepath.Join(e.dir, fmt.Sprintf("controller-%d.log", i)),
			health:  ports[2],
			args: []string{"controller",
				"--kubeconfig=" + e.dev.KubeconfigPath,
				"--namespace=" + operatorNamespace,
				"--leader-elect=true",
				// A dead leader's work waits out the lease: 8 s, not
				// 15. The renew deadline stays above a kube-apiserver
				// restart on a loaded machine.
				"--leader-elect-lease-duration=8s",
				"--leader-elect-renew-deadline=6s",
				"--leader-elect-retry-period=1s",
				"--metrics-addr=0",
				"--health-addr=" + ports[2],
				"--server-ips=" + e.hostIP,
				"--image=" + runnerImage,
				"--max-concurrent-runs=16",
				"--artifact-bind-address=" + ports[0],
				"--artifact-base-url=https://" + e.artifactProxy.addr(),
				"--state-server-bind-address=" + ports[1],
				"--state-server-advertised-url=https://" + e.stateProxy.addr(),
				fmt.Sprintf("--state-server-max-state-bytes=%d", maxStateBytes),
				"--postgres-allowed-hosts=" + e.pgDir,
				// Verbose: the artifact server logs handshake errors at V(1).
				"--log-dev",
			},
		}
		e.artifactProxy.addBackend(r, ports[0])
		e.stateProxy.addBackend(r, ports[1])
		cs.replicas = append(cs.replicas, r)
	}
	for _, r := range cs.replicas {
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
		cs.wg.Add(1)
		go cs.supervise(r)
	}
	t.Cleanup(cs.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, r := range cs.replicas {
		if err := poll(ctx, 2*time.Minute, r.ready); err != nil {
			t.Fatalf("%s not ready: %v\n%s", r.name, err, tail(r.logPath, 20))
		}
	}
	if _, err := cs.waitLeader(ctx, nil); err != nil {
		t.Fatal(err)
	}
	return cs
}

func (r *replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	cmd := exec.Command(terraceBinary, r.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failed to start %s: %w", r.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.cmd, r.done, r.logFrom = cmd, done, info.Size()
	r.starts++
	return nil
}

// supervise restarts r one second after it exits, until stop.
func (cs *controllers) supervise(r *replica) {
	defer cs.wg.Done()
	for {
		r.mu.Lock()
		done := r.done
		r.mu.Unlock()
		<-done
		if cs.stopping.Load() {
			return
		}
		time.Sleep(time.Second) // a restart delay, not a wait for a condition
		if cs.stopping.Load() {
			return
		}
		if err := r.start(); err != nil {
			return
		}
	}
}

func (cs *controllers) stop() {
	cs.stopping.Store(true)
	var wg sync.WaitGroup
	for _, r := range cs.replicas {
		r.mu.Lock()
		cmd, done := r.cmd, r.done
		r.mu.Unlock()
		if cmd == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}()
	}
	wg.Wait()
	cs.wg.Wait()
}

func (r *replica) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

func (r *replica) ready() error {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + r.health + "/readyz")
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}

// currentLog is the log of r's current process.
func (r *replica) currentLog() string {
	r.mu.Lock()
	from := r.logFrom
	r.mu.Unlock()
	b, err := os.ReadFile(r.logPath)
	if err != nil || int64(len(b)) < from {
		return ""
	}
	return string(b[from:])
}

// isLeader reports whether r's current process won the election: the
// Lease's holder is <hostname>_<uuid>, the same host for every replica, so
// the log says which.
func (r *replica) isLeader() bool {
	log := r.currentLog()
	return r.running() && (strings.Contains(log, "successfully acquired lease") || strings.Contains(log, "Starting workers"))
}

// waitLeader waits for a running leader other than not.
func (cs *controllers) waitLeader(ctx context.Context, not *replica) (*replica, error) {
	var leader *replica
	err := poll(ctx, 2*time.Minute, func() error {
		for _, r := range cs.replicas {
			if r != not && r.isLeader() {
				leader = r
				return nil
			}
		}
		return fmt.Errorf("no replica holds the lease")
	})
	return leader, err
}

// killLeader SIGKILLs the leader's process and returns it.
func (cs *controllers) killLeader() (*replica, error) {
	for _, r := range cs.replicas {
		if r.isLeader() {
			r.mu.Lock()
			pid := r.cmd.Process.Pid
			r.mu.Unlock()
			return r, syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	return nil, fmt.Errorf("no leader to kill")
}

// proxy stands in for the controllers' Service: it forwards each TCP
// connection to a running replica's server, and counts the bytes clients
// send, to tell when a large state upload is in flight.
type proxy struct {
	l net.Listener

	mu       sync.Mutex
	backends []proxyBackend
	next     int

	// uploading counts connections that have carried more than
	// uploadThreshold bytes from the client and are still open.
	uploading atomic.Int64
}

type proxyBackend struct {
	r    *replica
	addr string
}

// uploadThreshold is far above a TLS handshake and a lock request, and
// below the states of the upload fault's Stacks.
const uploadThreshold = 256 << 10

// uploadHold is how long a large upload stalls once past uploadThreshold:
// the window of the faults mid-state-upload.
const uploadHold = 2 * time.Second

// startProxy listens on ip, the host's end of the node's link, where
// runner pods reach it.
func startProxy(t *testing.T, ip string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	go p.serve()
	t.Cleanup(func() { _ = l.Close() })
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) addBackend(r *replica, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backends = append(p.backends, proxyBackend{r: r, addr: addr})
}

func (p *proxy) serve() {
	for {
		conn, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.forward(conn)
	}
}

// forward connects to the next replica that accepts, as kube-proxy would
// once a dead pod left the endpoints.
func (p *proxy) forward(conn net.Conn) {
	defer func() { _ = conn.Close() }()
	p.mu.Lock()
	backends := append([]proxyBackend(nil), p.backends...)
	start := p.next
	p.next++
	p.mu.Unlock()
	var upstream net.Conn
	for i := range backends {
		b := backends[(start+i)%len(backends)]
		if !b.r.running() {
			continue
		}
		c, err := net.DialTimeout("tcp", b.addr, time.Second)
		if err == nil {
			upstream = c
			break
		}
	}
	if upstream == nil {
		return
	}
	defer func() { _ = upstream.Close() }()
	done := make(chan struct{}, 2)
	go func() {
		counter := &uploadCounter{w: upstream, p: p}
		_, _ = io.Copy(counter, conn)
		counter.close()
		if tc, ok := upstream.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, upstream)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// uploadCounter writes through and marks its connection as uploading once
// it has carried uploadThreshold bytes, until the copy ends.
type uploadCounter struct {
	w       io.Writer
	p       *proxy
	n       int64
	counted bool
}

func (u *uploadCounter) Write(b []byte) (int, error) {
	n, err := u.w.Write(b)
	u.n += int64(n)
	if !u.counted && u.n > uploadThreshold {
		u.counted = true
		u.p.uploading.Add(1)
		// A slow link for the rest of the upload: on a loaded machine
		// a state passed before the triggers, polling every 10 ms,
		// saw it, and the upload faults missed run after run.
		time.Sleep(uploadHold)
	}
	if err != nil && u.counted {
		u.p.uploading.Add(-1)
		u.counted = false
	}
	return n, err
}

// close releases the mark when the client's side of the copy ends.
func (u *uploadCounter) close() {
	if u.counted {
		u.p.uploading.Add(-1)
		u.counted = false
	}
}

func freePorts(t *testing.T, n int) []string {
	t.Helper()
	addrs, err := testenv.FreeLoopbackAddrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// hostPorts returns n free addresses on ip.
func hostPorts(t *testing.T, ip string, n int) []string {
	t.Helper()
	ports, err := devcluster.FreePorts(ip, n)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, net.JoinHostPort(ip, strconv.Itoa(p)))
	}
	return addrs
}

// tail returns up to n last lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
