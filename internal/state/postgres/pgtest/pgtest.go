// Package pgtest gives tests a real PostgreSQL: the one named by
// TERRACE_TEST_POSTGRES_URL, or a throwaway server that hack/postgres.sh
// starts (installing PostgreSQL from Debian's packages when missing), so
// `go test` works on a clean machine.
package pgtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// EnvURL names the variable that points tests at an existing server.
const EnvURL = "TERRACE_TEST_POSTGRES_URL"

// Start returns a connection URL and a func that stops what Start started.
// Call it from TestMain.
func Start() (url string, stop func(), err error) {
	return StartIn("")
}

// StartIn is Start with the throwaway server's directory (its unix socket
// directory too) chosen by the caller, e.g. to allow it by name before it
// exists; "" makes a new one. The directory should be named
// /tmp/terrace-pg.* so stop removes it.
func StartIn(dir string) (url string, stop func(), err error) {
	if url := os.Getenv(EnvURL); url != "" {
		return url, func() {}, nil
	}
	s, err := startServer(dir, "")
	if err != nil {
		return "", nil, err
	}
	return s.URL, s.Stop, nil
}

// Server is a throwaway PostgreSQL started by StartListening.
type Server struct {
	// URL connects through the unix socket in the server's directory;
	// TCPURL through the TCP address it listens on.
	URL, TCPURL string
	// Stop stops the server and removes its directory.
	Stop func()
}

// StartListening starts a throwaway server in dir ("" for a new one) that
// also listens on the TCP address listen (IP:port) and trusts every client
// reaching it there: for clients in network namespaces of their own, such
// as the dev node's pods, on an address only they reach.
func StartListening(dir, listen string) (*Server, error) {
	return startServer(dir, listen)
}

func startServer(dir, listen string) (*Server, error) {
	script := filepath.Join(testenv.RepoRoot(), "hack", "postgres.sh")
	var stderr bytes.Buffer
	args := []string{script, "start"}
	if dir != "" {
		args = append(args, dir)
	}
	cmd := exec.Command("bash", args...)
	cmd.Stderr = &stderr
	if listen != "" {
		cmd.Env = append(os.Environ(), "TERRACE_POSTGRES_LISTEN="+listen)
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("failed to start PostgreSQL with hack/postgres.sh: %w: %s", err, stderr.String())
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vars[k] = strings.Trim(v, "'")
		}
	}
	url, started := vars["TERRACE_TEST_POSTGRES_URL"], vars["TERRACE_TEST_POSTGRES_DIR"]
	if url == "" || started == "" || listen != "" && vars["TERRACE_TEST_POSTGRES_TCP_URL"] == "" {
		return nil, fmt.Errorf("hack/postgres.sh printed no URL: %s", out)
	}
	return &Server{
		URL: url, TCPURL: vars["TERRACE_TEST_POSTGRES_TCP_URL"],
		Stop: func() { _ = exec.Command("bash", script, "stop", started).Run() },
	}, nil
}

// Main is a TestMain body for packages that need only PostgreSQL.
func Main(run func(url string) int) {
	url, stop, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	code := run(url)
	stop()
	os.Exit(code)
}
