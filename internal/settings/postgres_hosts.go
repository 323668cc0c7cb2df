package settings

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// ErrPostgresHostNotAllowed is matched by PostgresHostPolicy.Check's refusals.
var ErrPostgresHostNotAllowed = errors.New("PostgreSQL host not allowed")

// PostgresHostPolicy decides which PostgreSQL servers the controller may
// connect to for a TerraceConfig. The controller connects from its own
// network position, so a namespace admin naming any host would reach
// whatever the controller can reach (internal databases, cloud metadata),
// and a unix socket would log in as the controller's own OS user (peer
// authentication). So:
//   - the operator-namespace config is the operator's: it may name any server;
//   - a namespace config may name only servers the operator lists
//     (--postgres-allowed-hosts) or the TCP host and port of the
//     operator-namespace config's own connection;
//   - a unix socket is allowed to a namespace config only when the operator
//     lists its directory explicitly.
//
// Every host of the connection string (fallback hosts too) must pass.
type PostgresHostPolicy struct {
	// OperatorNamespace holds the operator's own config.
	OperatorNamespace string
	// Allowed are "host", "host:port" ("[v6]:port") or an absolute unix
	// socket directory.
	Allowed []string
	// Reader reads the operator config and its connection Secret; pass an
	// uncached reader for Secrets.
	Reader client.Reader
}

// Check returns nil when a config in configNamespace may use connString,
// and otherwise an error matching ErrPostgresHostNotAllowed that names the
// host (never the password) and what to do. It never connects.
func (p *PostgresHostPolicy) Check(ctx context.Context, configNamespace, connString string) error {
	if p == nil || configNamespace == p.OperatorNamespace {
		return nil
	}
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		// pgx's parse errors may quote the string, password included: say less.
		return errors.New("the value is not a valid PostgreSQL connection URL or key=value string")
	}
	var operatorHosts []hostPort
	for _, h := range connectionHosts(cfg) {
		if p.listed(h) {
			continue
		}
		if h.socket() {
			return fmt.Errorf("%w: unix socket %s: a namespace's TerraceConfig may not use unix sockets (the controller would log in as its own OS user); use a TCP host the operator allows, or ask the cluster admin to list the socket directory in --postgres-allowed-hosts", ErrPostgresHostNotAllowed, h.host)
		}
		if operatorHosts == nil {
			if operatorHosts, err = p.operatorHosts(ctx); err != nil {
				return err
			}
		}
		if !slices.ContainsFunc(operatorHosts, h.same) {
			return fmt.Errorf("%w: %s is neither the operator config's PostgreSQL server nor in the controller's --postgres-allowed-hosts (%s); use an allowed server or ask the cluster admin to allow this one", ErrPostgresHostNotAllowed, h, p.allowedText())
		}
	}
	return nil
}

type hostPort struct {
	host string
	port uint16
}

func (h hostPort) socket() bool { return strings.HasPrefix(h.host, "/") }

// same compares host names without case (DNS does), socket paths exactly.
func (h hostPort) same(o hostPort) bool {
	if h.socket() || o.socket() {
		return h == o
	}
	return strings.EqualFold(h.host, o.host) && h.port == o.port
}

func (h hostPort) String() string {
	if h.socket() {
		return h.host
	}
	return net.JoinHostPort(h.host, strconv.Itoa(int(h.port)))
}

func connectionHosts(cfg *pgconn.Config) []hostPort {
	hosts := []hostPort{{cfg.Host, cfg.Port}}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, hostPort{f.Host, f.Port})
	}
	return hosts
}

// listed reports whether the operator's list allows h.
func (p *PostgresHostPolicy) listed(h hostPort) bool {
	for _, entry := range p.Allowed {
		entry = strings.TrimSpace(entry)
		if strings.HasPrefix(entry, "/") {
			if h.socket() && filepath.Clean(entry) == filepath.Clean(h.host) {
				return true
			}
			continue
		}
		host, port := entry, ""
		if hh, pp, err := net.SplitHostPort(entry); err == nil {
			host, port = hh, pp
		}
		if !h.socket() && strings.EqualFold(host, h.host) && (port == "" || port == strconv.Itoa(int(h.port))) {
			return true
		}
	}
	return false
}

func (p *PostgresHostPolicy) allowedText() string {
	if len(p.Allowed) == 0 {
		return "empty"
	}
	return strings.Join(p.Allowed, ", ")
}

// operatorHosts are the TCP hosts of the operator config's own
// connection; none when it names none.
func (p *PostgresHostPolicy) operatorHosts(ctx context.Context) ([]hostPort, error) {
	var cfg terracev1.TerraceConfig
	err := p.Reader.Get(ctx, types.NamespacedName{Namespace: p.OperatorNamespace, Name: terracev1.TerraceConfigName}, &cfg)
	if apierrors.IsNotFound(err) {
		return []hostPort{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the operator's TerraceConfig: %w", err)
	}
	st := cfg.Spec.State
	if st == nil || st.Postgres == nil || st.Postgres.ConnectionSecretRef.Name == "" {
		return []hostPort{}, nil
	}
	ref := st.Postgres.ConnectionSecretRef
	var secret corev1.Secret
	err = p.Reader.Get(ctx, types.NamespacedName{Namespace: p.OperatorNamespace, Name: ref.Name}, &secret)
	if apierrors.IsNotFound(err) {
		return []hostPort{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the operator's PostgreSQL connection Secret: %w", err)
	}
	parsed, err := pgconn.ParseConfig(string(secret.Data[KeyOrDefault(ref.Key, DefaultPostgresURLKey)]))
	if err != nil {
		return []hostPort{}, nil
	}
	hosts := []hostPort{}
	for _, h := range connectionHosts(parsed) {
		if !h.socket() {
			hosts = append(hosts, h)
		}
	}
	return hosts, nil
}
