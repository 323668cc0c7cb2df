package devnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// serveLogs starts the HTTPS endpoint the API server proxies `kubectl logs`
// to (GET /containerLogs/{namespace}/{pod}/{container}). It records the
// port for the Node status and returns a function that stops the server.
func (n *Node) serveLogs() (func(), error) {
	cert, err := tls.X509KeyPair(n.opts.ServingCertPEM, n.opts.ServingKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("failed to load log server certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(n.opts.ClientCAPEM) {
		return nil, errors.New("log server needs a client CA to authenticate the API server")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		return nil, fmt.Errorf("failed to listen for log requests: %w", err)
	}
	n.logPort = ln.Addr().(*net.TCPAddr).Port
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", n.handleLogs)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS12,
		},
		// HTTP/2 off: plain streaming responses are all the API server needs.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Info("log server stopped", "error", err.Error())
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
	}, nil
}

func (n *Node) handleLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	q := r.URL.Query()
	previous := q.Get("previous") == "true"
	path, err := FindLog(n.opts.Dir, ns, pod, container, previous)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	defer func() { _ = f.Close() }()
	if tail, err := strconv.Atoi(q.Get("tailLines")); err == nil && tail >= 0 {
		if err := seekTail(f, tail); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	var out io.Writer = w
	if limit, err := strconv.ParseInt(q.Get("limitBytes"), 10, 64); err == nil && limit > 0 {
		out = &limitWriter{w: w, left: limit}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	follow := q.Get("follow") == "true" && !previous
	_ = copyLog(r.Context(), out, w, f, follow, func() bool { return n.containerRunning(ns, pod, container, path) })
}

// copyLog copies the log, and with follow keeps copying what is appended
// while running reports the container still writes to it.
func copyLog(ctx context.Context, out io.Writer, w http.ResponseWriter, f *os.File, follow bool, running func() bool) error {
	flusher, _ := w.(http.Flusher)
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		if _, err := io.Copy(out, f); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		if !follow {
			return nil
		}
		alive := running()
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if !alive {
			_, err := io.Copy(out, f)
			return err
		}
	}
}

// containerRunning reports whether the container is running and still
// writing to path.
func (n *Node) containerRunning(ns, pod, container, path string) bool {
	w := n.worker(ns, pod)
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.state.containers {
		if c.name == container && c.runningSince != nil {
			return w.logPath(container, c.restartCount) == path
		}
	}
	for _, c := range w.state.initContainers {
		if c.name == container && c.runningSince != nil {
			return w.logPath(container, c.restartCount) == path
		}
	}
	return false
}

// FindLog returns the log file of a pod's container under a devnode's Dir:
// the newest pod of that name, its latest run, or the run before with
// previous. An empty container means the pod's only container.
func FindLog(dir, namespace, pod, container string, previous bool) (string, error) {
	podDirs, err := filepath.Glob(filepath.Join(dir, "logs", globEscape(namespace+"_"+pod+"_")+"*"))
	if err != nil || len(podDirs) == 0 {
		return "", fmt.Errorf("no logs for pod %s/%s under %s", namespace, pod, dir)
	}
	sort.Slice(podDirs, func(i, j int) bool { return modTime(podDirs[i]).After(modTime(podDirs[j])) })
	podDir := podDirs[0]
	if container == "" {
		entries, err := os.ReadDir(podDir)
		if err != nil {
			return "", fmt.Errorf("failed to read %s: %w", podDir, err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if len(names) != 1 {
			return "", fmt.Errorf("pod %s/%s has containers [%s]: name one", namespace, pod, strings.Join(names, " "))
		}
		container = names[0]
	}
	runs, _ := filepath.Glob(filepath.Join(podDir, globEscape(container), "*.log"))
	var numbers []int
	for _, r := range runs {
		if k, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(r), ".log")); err == nil {
			numbers = append(numbers, k)
		}
	}
	if len(numbers) == 0 {
		return "", fmt.Errorf("no logs for container %q of pod %s/%s", container, namespace, pod)
	}
	sort.Ints(numbers)
	pick := numbers[len(numbers)-1]
	if previous {
		if len(numbers) < 2 {
			return "", fmt.Errorf("container %q of pod %s/%s has no previous run", container, namespace, pod)
		}
		pick = numbers[len(numbers)-2]
	}
	return filepath.Join(podDir, container, strconv.Itoa(pick)+".log"), nil
}

func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(s)
}

func modTime(path string) time.Time {
	info, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return info.ModTime()
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	size := info.Size()
	if n == 0 {
		_, err := f.Seek(size, io.SeekStart)
		return err
	}
	const chunk = 8 << 10
	lines := 0
	pos := size
	buf := make([]byte, chunk)
	// A final newline ends the last line rather than starting a new one.
	skipLast := true
	for pos > 0 {
		step := int64(min(chunk, pos))
		pos -= step
		if _, err := f.ReadAt(buf[:step], pos); err != nil {
			return err
		}
		for i := step - 1; i >= 0; i-- {
			if buf[i] != '\n' {
				skipLast = false
				continue
			}
			if skipLast {
				skipLast = false
				continue
			}
			lines++
			if lines == n {
				_, err := f.Seek(pos+i+1, io.SeekStart)
				return err
			}
		}
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, io.ErrShortWrite
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}
