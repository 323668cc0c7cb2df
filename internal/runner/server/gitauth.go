package server

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
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/go-git/go-git/v5/plumbing/transport"
	gitclient "github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/skeema/knownhosts"
	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/runner"
)

// The keys of a Git credentials Secret, as Flux's GitRepository reads them.
const (
	gitKeyUsername    = "username"
	gitKeyPassword    = "password"
	gitKeyBearerToken = "bearerToken"
	gitKeyIdentity    = "identity"
	gitKeyKnownHosts  = "known_hosts"
	// gitKeyCA is a PEM bundle of CAs trusted for https besides the
	// system's (a self-hosted forge's own CA).
	gitKeyCA = "ca.crt"
)

// maxCredentialFile bounds what is read of one key of the Secret.
const maxCredentialFile = 64 << 10

// gitEndpoint is a parsed repository URL.
type gitEndpoint struct {
	*transport.Endpoint
	raw string
}

func parseGitURL(raw string) (gitEndpoint, error) {
	invalid := func(why string) (gitEndpoint, error) {
		return gitEndpoint{}, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "the Git URL "+why)
	}
	if raw == "" {
		return invalid("is empty")
	}
	ep, err := transport.NewEndpoint(raw)
	if err != nil {
		return invalid("must be https://host/path, ssh://user@host/path or user@host:path")
	}
	switch ep.Protocol {
	case "http", "https", "ssh":
	default:
		return invalid(fmt.Sprintf("has the scheme %q; only https, http and ssh are cloned", ep.Protocol))
	}
	if ep.Host == "" {
		return invalid("must name a host")
	}
	return gitEndpoint{Endpoint: ep, raw: raw}, nil
}

// describe names the repository in messages: scheme, host and path,
// never a user name or password written into the URL.
func (e gitEndpoint) describe() string {
	host := e.Host
	if e.Port != 0 {
		host = net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	}
	return e.Protocol + "://" + host + "/" + strings.TrimPrefix(e.Path, "/")
}

// scrub removes the URL as given (which may carry credentials) from a
// library's error text.
func (e gitEndpoint) scrub(msg string) string {
	msg = strings.ReplaceAll(msg, e.raw, e.describe())
	if e.Password != "" {
		msg = strings.ReplaceAll(msg, e.Password, "(redacted)")
	}
	return msg
}

// gitCredentials are what a clone authenticates with.
type gitCredentials struct {
	auth transport.AuthMethod
	// roots are the CAs https servers are verified with: the system's,
	// plus ca.crt when the Secret has it; nil for the system's alone.
	roots *x509.CertPool
}

// gitAuth reads the credentials for ep from dir, where the pod mounts the
// Secret of spec.source.git.secretRef. ssh always needs known_hosts: a
// host key is never accepted unseen.
func gitAuth(ep gitEndpoint, dir string) (gitCredentials, error) {
	invalid := func(msg string) (gitCredentials, error) {
		return gitCredentials{}, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, msg)
	}
	read := func(key string) ([]byte, error) {
		if dir == "" {
			return nil, nil
		}
		f, err := os.Open(filepath.Join(dir, key))
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("failed to read the key %s of the Git credentials: %w", key, err)
		}
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, maxCredentialFile+1))
		if err != nil {
			return nil, fmt.Errorf("failed to read the key %s of the Git credentials: %w", key, err)
		}
		if len(data) > maxCredentialFile {
			return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("the key %s of the Git credentials is larger than %d bytes", key, maxCredentialFile))
		}
		return data, nil
	}
	values := map[string][]byte{}
	for _, k := range []string{gitKeyUsername, gitKeyPassword, gitKeyBearerToken, gitKeyIdentity, gitKeyKnownHosts, gitKeyCA} {
		v, err := read(k)
		if err != nil {
			return gitCredentials{}, err
		}
		if v != nil {
			values[k] = v
		}
	}
	line := func(k string) string { return strings.TrimRight(string(values[k]), "\r\n") }

	if ep.Protocol == "ssh" {
		if values[gitKeyIdentity] == nil || values[gitKeyKnownHosts] == nil {
			return invalid(fmt.Sprintf("cloning %s over ssh needs a Secret (spec.source.git.secretRef) with the keys identity and known_hosts", ep.describe()))
		}
		user := ep.User
		if user == "" {
			user = "git"
		}
		keys, err := gitssh.NewPublicKeys(user, values[gitKeyIdentity], line(gitKeyPassword))
		if err != nil {
			return invalid("the key identity of the Git credentials is not a private key the runner can use (PEM or OpenSSH format; its passphrase in password)")
		}
		db, err := knownHostsDB(values[gitKeyKnownHosts], dir)
		if err != nil {
			return invalid("the key known_hosts of the Git credentials cannot be read: " + err.Error())
		}
		addr := hostWithPort(ep)
		keys.HostKeyCallback = hostKeyCallback(db, ep.describe())
		keys.HostKeyAlgorithms = db.HostKeyAlgorithms(addr)
		return gitCredentials{auth: keys}, nil
	}

	var creds gitCredentials
	if ca := values[gitKeyCA]; ca != nil {
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(ca) {
			return invalid("the key ca.crt of the Git credentials holds no PEM certificate")
		}
		creds.roots = pool
	}

	token, user, password := line(gitKeyBearerToken), line(gitKeyUsername), line(gitKeyPassword)
	if (token != "" || password != "") && ep.Protocol != "https" {
		return invalid(fmt.Sprintf("credentials are sent only over https, and %s is %s", ep.describe(), ep.Protocol))
	}
	switch {
	case token != "":
		creds.auth = &githttp.TokenAuth{Token: token}
	case password != "":
		if user == "" {
			user = "git" // a token as the password: most forges take any user name
		}
		creds.auth = &githttp.BasicAuth{Username: user, Password: password}
	}
	return creds, nil
}

func hostWithPort(ep gitEndpoint) string {
	port := ep.Port
	if port == 0 {
		port = 22
	}
	return net.JoinHostPort(ep.Host, strconv.Itoa(port))
}

// knownHostsDB parses known_hosts. The library reads files only, so the
// Secret's mounted file is read in place (data was read from it to check
// it is there and bounded).
func knownHostsDB(data []byte, dir string) (*knownhosts.HostKeyDB, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, errors.New("it is empty")
	}
	return knownhosts.NewDB(filepath.Join(dir, gitKeyKnownHosts))
}

// hostKeyError: the server's host key is not the one known_hosts names.
type hostKeyError struct {
	host    string
	changed bool
}

func (e *hostKeyError) Error() string {
	if e.changed {
		return fmt.Sprintf("the ssh host key of %s does not match the one in known_hosts (spec.source.git.secretRef): the host is not the one the Secret trusts, or its key changed", e.host)
	}
	return fmt.Sprintf("the ssh host key of %s is not in known_hosts (spec.source.git.secretRef): add the host's key to the Secret's known_hosts", e.host)
}

func hostKeyCallback(db *knownhosts.HostKeyDB, host string) ssh.HostKeyCallback {
	check := db.HostKeyCallback()
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		err := check(hostname, remote, key)
		switch {
		case err == nil:
			return nil
		case knownhosts.IsHostUnknown(err):
			return &hostKeyError{host: host}
		case knownhosts.IsHostKeyChanged(err):
			return &hostKeyError{host: host, changed: true}
		}
		return err
	}
}

// cloneHTTPKey carries a clone's http settings to the transport.
type cloneHTTPKey struct{}

// cloneHTTP is one clone's http(s) settings: the bytes it may still read
// (ssh's are bounded by the objects kept and the time), and its transport.
type cloneHTTP struct {
	budget atomic.Int64
	rt     http.RoundTripper
}

// baseTransport is the default one: the pod's proxy variables, the
// system's CAs.
var baseTransport = http.DefaultTransport.(*http.Transport).Clone()

// withCloneHTTP bounds the bytes read for the requests made with ctx and
// verifies servers with roots (nil: the system's CAs).
func withCloneHTTP(ctx context.Context, limit int64, roots *x509.CertPool) context.Context {
	c := &cloneHTTP{rt: baseTransport}
	c.budget.Store(limit)
	if roots != nil {
		t := baseTransport.Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		c.rt = t
	}
	return context.WithValue(ctx, cloneHTTPKey{}, c)
}

// cloneTransport sends each request through its clone's transport and
// stops reading once the clone's budget is spent. go-git's http client is
// one per process (transport/client), so the settings come with the
// request's context; a request without them (go-git used elsewhere in the
// process, such as a test pushing to its git server) goes out as go-git's
// own client would send it.
type cloneTransport struct{}

func (cloneTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, ok := req.Context().Value(cloneHTTPKey{}).(*cloneHTTP)
	if !ok {
		return baseTransport.RoundTrip(req)
	}
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &budgetBody{ReadCloser: resp.Body, budget: &c.budget}
	return resp, nil
}

type budgetBody struct {
	io.ReadCloser
	budget *atomic.Int64
}

func (b *budgetBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.budget.Add(-int64(n)) < 0 {
		return n, errCloneTooLarge
	}
	return n, err
}

func init() {
	c := githttp.NewClient(&http.Client{Transport: cloneTransport{}})
	gitclient.InstallProtocol("https", c)
	gitclient.InstallProtocol("http", c)
}
