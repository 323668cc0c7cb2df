package server

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// The git servers of the clone tests are Debian's git itself: its
// http-backend behind net/http/cgi, and its upload-pack behind an ssh
// server of golang.org/x/crypto/ssh. go-git's own server side refuses
// shallow fetches, which the runner always makes.

// testRepo is a bare repository on disk, written with the git command.
type testRepo struct {
	t    *testing.T
	root string // holds repo.git
	work string
	when time.Time
}

func requireGit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("the clone tests need Debian's git (apt-get install git; make test installs it)")
	}
}

func newTestRepo(t *testing.T) *testRepo {
	t.Helper()
	requireGit(t)
	root := t.TempDir()
	r := &testRepo{t: t, root: root, work: filepath.Join(t.TempDir(), "work"), when: time.Unix(1_700_000_000, 0)}
	r.git(root, "init", "--bare", "-b", "main", "repo.git")
	r.git("", "init", "-b", "main", r.work)
	r.git(r.work, "remote", "add", "origin", filepath.Join(root, "repo.git"))
	return r
}

func (r *testRepo) git(dir string, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	date := r.when.Format(time.RFC3339)
	cmd.Env = append(os.Environ(),
		"GIT_AUTHOR_NAME=Ada Lovelace", "GIT_AUTHOR_EMAIL=ada@example.com", "GIT_AUTHOR_DATE="+date,
		"GIT_COMMITTER_NAME=Ada Lovelace", "GIT_COMMITTER_EMAIL=ada@example.com", "GIT_COMMITTER_DATE="+date,
		"GIT_CONFIG_NOSYSTEM=1", "HOME="+r.root)
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit replaces the work tree's files with files (a value starting with
// "->" is a symlink to the rest), commits and pushes to branch; it
// returns the commit's hash.
func (r *testRepo) commit(branch, message string, files map[string]string) string {
	r.t.Helper()
	r.when = r.when.Add(time.Minute)
	entries, _ := os.ReadDir(r.work)
	for _, e := range entries {
		if e.Name() != ".git" {
			_ = os.RemoveAll(filepath.Join(r.work, e.Name()))
		}
	}
	for name, content := range files {
		p := filepath.Join(r.work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			r.t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasPrefix(content, "->"):
			err = os.Symlink(strings.TrimPrefix(content, "->"), p)
		case strings.HasPrefix(content, "#!"):
			err = os.WriteFile(p, []byte(content), 0o755)
		default:
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			r.t.Fatal(err)
		}
	}
	r.git(r.work, "checkout", "-q", "-B", branch)
	r.git(r.work, "add", "-A")
	r.git(r.work, "commit", "-q", "--allow-empty", "-m", message)
	r.git(r.work, "push", "-q", "-f", "origin", branch)
	return r.git(r.work, "rev-parse", "HEAD")
}

// tag tags the work tree's HEAD (annotated when message is set) and pushes it.
func (r *testRepo) tag(name, message string) {
	r.t.Helper()
	if message != "" {
		r.git(r.work, "tag", "-a", name, "-m", message)
	} else {
		r.git(r.work, "tag", name)
	}
	r.git(r.work, "push", "-q", "origin", "refs/tags/"+name)
}

// gitHTTPHandler serves the repositories under root with git http-backend.
func gitHTTPHandler(root string) http.Handler {
	return &cgi.Handler{
		Path: "/usr/lib/git-core/git-http-backend",
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
}

// serveHTTP serves the repository over plain http and returns its URL.
func (r *testRepo) serveHTTP() string {
	srv := httptest.NewServer(gitHTTPHandler(r.root))
	r.t.Cleanup(srv.Close)
	return srv.URL + "/repo.git"
}

// serveHTTPS serves it over https behind check (nil allows everyone) and
// returns its URL and the server's CA certificate in PEM.
func (r *testRepo) serveHTTPS(check func(*http.Request) bool) (string, []byte) {
	h := gitHTTPHandler(r.root)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if check != nil && !check(req) {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, req)
	}))
	r.t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv.URL + "/repo.git", ca
}

// sshGitServer serves the repositories under root over ssh: each exec
// of git-upload-pack runs Debian's, for clients with the key clientKey.
type sshGitServer struct {
	addr    string
	hostKey ssh.PublicKey
}

func serveSSH(t *testing.T, root string, clientKey ssh.PublicKey) *sshGitServer {
	t.Helper()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if string(key.Marshal()) == string(clientKey.Marshal()) {
				return nil, nil
			}
			return nil, fmt.Errorf("unknown key")
		},
	}
	cfg.AddHostKey(signer)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go serveSSHConn(conn, cfg, root)
		}
	}()
	return &sshGitServer{addr: lis.Addr().String(), hostKey: signer.PublicKey()}
}

func serveSSHConn(conn net.Conn, cfg *ssh.ServerConfig, root string) {
	defer conn.Close()
	_, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, requests, err := nc.Accept()
		if err != nil {
			return
		}
		go func() {
			defer ch.Close()
			for req := range requests {
				if req.Type != "exec" {
					_ = req.Reply(false, nil)
					continue
				}
				var payload struct{ Command string }
				_ = ssh.Unmarshal(req.Payload, &payload)
				verb, arg, _ := strings.Cut(payload.Command, " ")
				if verb != "git-upload-pack" {
					_ = req.Reply(false, nil)
					return
				}
				_ = req.Reply(true, nil)
				repo := filepath.Join(root, filepath.Clean("/"+strings.Trim(arg, "'\"")))
				cmd := exec.Command("git-upload-pack", repo)
				cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
				code := uint32(0)
				if err := cmd.Run(); err != nil {
					code = 1
				}
				_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{code}))
				return
			}
		}()
	}
}

// knownHostsLine is the known_hosts line of the server.
func (s *sshGitServer) knownHostsLine() string {
	host, port, _ := net.SplitHostPort(s.addr)
	return fmt.Sprintf("[%s]:%s %s", host, port, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.hostKey))))
}

// newClientKey makes an ed25519 key: its OpenSSH PEM and its public key.
func newClientKey(t *testing.T) ([]byte, ssh.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), sshPub
}

// credentialsDir writes a Secret's keys as the kubelet mounts them.
func credentialsDir(t *testing.T, keys map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range keys {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o440); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
