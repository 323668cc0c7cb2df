package backend_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"

	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/settings"
)

// acceptCounter listens and counts the connections it accepts.
type acceptCounter struct {
	l        net.Listener
	accepted atomic.Int32
}

func listen(t *testing.T, network, address string) *acceptCounter {
	t.Helper()
	l, err := net.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	a := &acceptCounter{l: l}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			a.accepted.Add(1)
			_ = c.Close()
		}
	}()
	return a
}

func policedBackends(t *testing.T, allowed ...string) *backend.Backends {
	t.Helper()
	b := newBackends(t)
	b.PostgresHosts = &settings.PostgresHostPolicy{OperatorNamespace: operatorNamespace, Allowed: allowed, Reader: env.Client}
	return b
}

// The attack: a namespace admin points their TerraceConfig at a server the
// controller can reach (loopback here, an internal database in a real
// cluster) or at a unix socket (where the controller would log in as its
// own OS user). The stores refuse before any connection; the error names
// the host, not the password, and says what to do; another namespace is
// served meanwhile.
func TestNamespaceConfigCannotPointAtAnyPostgresHost(t *testing.T) {
	tcp := listen(t, "tcp", "127.0.0.1:0")
	sockDir := t.TempDir()
	sock := listen(t, "unix", filepath.Join(sockDir, ".s.PGSQL.5432"))
	b := policedBackends(t)

	for name, url := range map[string]string{
		"loopback":    "postgres://terrace:hunter2@" + tcp.l.Addr().String() + "/terrace?connect_timeout=2",
		"unix socket": "postgres://terrace:hunter2@/terrace?host=" + sockDir + "&connect_timeout=2",
		"fallback":    "host=" + sockDir + "," + strings.Split(tcp.l.Addr().String(), ":")[0] + " user=terrace password=hunter2",
	} {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			putSecret(t, ns, "pg", map[string][]byte{"url": []byte(url)})
			putConfig(t, ns, postgresSpec("pg"))
			_, err := b.For(ctx(t), ns)
			if !errors.Is(err, backend.ErrMisconfigured) || !errors.Is(err, settings.ErrPostgresHostNotAllowed) {
				t.Fatalf("For = %v, want a refusal matching ErrMisconfigured and ErrPostgresHostNotAllowed", err)
			}
			if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "--postgres-allowed-hosts") {
				t.Errorf("refusal leaks the password or does not say what to do: %v", err)
			}
			other := env.Namespace(t)
			if set, err := b.For(ctx(t), other); err != nil || set.Effective.StateBackend != "secrets" {
				t.Errorf("another namespace is not served: %v", err)
			}
		})
	}
	if n := tcp.accepted.Load() + sock.accepted.Load(); n != 0 {
		t.Fatalf("the controller connected %d times to refused servers", n)
	}
}

// The operator allows servers by name, host:port or socket directory; the
// operator config's own server is allowed without being listed.
func TestAllowedPostgresHostsAreUsed(t *testing.T) {
	ns := env.Namespace(t)
	putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL)})
	putConfig(t, ns, postgresSpec("pg"))
	sockDir := socketDir(t, dbURL)
	b := policedBackends(t, "db.internal:5432", sockDir)
	if _, err := b.For(ctx(t), ns); err != nil {
		t.Fatalf("a listed socket directory is refused: %v", err)
	}

	policy := &settings.PostgresHostPolicy{OperatorNamespace: operatorNamespace, Allowed: []string{"db.internal:5432", "any-port.internal"}, Reader: env.Client}
	cases := map[string]bool{
		"postgres://u:p@db.internal:5432/x":        true,
		"postgres://u:p@DB.Internal/x":             true,
		"postgres://u:p@db.internal:6000/x":        false,
		"postgres://u:p@any-port.internal:7000/x":  true,
		"postgres://u:p@db.internal,evil:5432/x":   false,
		"postgres://u:p@operator-db.internal:5432": false,
	}
	check := func() {
		t.Helper()
		for url, want := range cases {
			err := policy.Check(ctx(t), ns, url)
			if (err == nil) != want {
				t.Errorf("Check(%s) = %v, want allowed=%v", url, err, want)
			}
		}
		if err := policy.Check(ctx(t), operatorNamespace, "postgres://u@/x?host=/run/anything"); err != nil {
			t.Errorf("the operator's own config was refused: %v", err)
		}
	}
	check()
	putSecret(t, operatorNamespace, "operator-pg", map[string][]byte{"url": []byte("postgres://op:pw@operator-db.internal:5432/terrace")})
	putConfig(t, operatorNamespace, postgresSpec("operator-pg"))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: terracev1.TerraceConfigName}})
	})
	cases["postgres://u:p@operator-db.internal:5432"] = true
	cases["postgres://u:p@operator-db.internal:5433"] = false
	check()
}

// socketDir returns the host (a socket directory) of a connection string.
func socketDir(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.ConnConfig.Host
}

func activeConnections(t *testing.T, admin *pgxpool.Pool, application string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(ctx(t), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, application).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitConnections(t *testing.T, admin *pgxpool.Pool, application string, want func(int) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n := activeConnections(t, admin, application)
		if want(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d connections of %s", what, n, application)
		}
		<-tick.C
	}
}

// A pool is closed when its namespace's connection changes and when the
// namespace lets go of PostgreSQL: no connection is left behind.
func TestPoolsAreClosedWhenTheirConnectionGoesAway(t *testing.T) {
	admin, err := pgxpool.New(ctx(t), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	appA, appB := "terrace-a-"+hex.EncodeToString(id), "terrace-b-"+hex.EncodeToString(id)

	ns := env.Namespace(t)
	b := newBackends(t)
	b.SecretRecheck = time.Nanosecond
	b.SetPoolCloseGrace(0)
	putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL + "&application_name=" + appA)})
	putConfig(t, ns, postgresSpec("pg"))
	use := func() {
		t.Helper()
		set, err := b.For(ctx(t), ns)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := set.States.List(ctx(t), ns); err != nil {
			t.Fatal(err)
		}
	}
	use()
	waitConnections(t, admin, appA, func(n int) bool { return n > 0 }, "first connection open")

	putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL + "&application_name=" + appB)})
	use()
	waitConnections(t, admin, appA, func(n int) bool { return n == 0 }, "the replaced connection closed")
	waitConnections(t, admin, appB, func(n int) bool { return n > 0 }, "the new connection open")

	// The namespace's last state is gone: its location and pool go too.
	if err := b.ForgetEmptyLocation(ctx(t), ns); err != nil {
		t.Fatal(err)
	}
	waitConnections(t, admin, appB, func(n int) bool { return n == 0 }, "the forgotten namespace's connection closed")
}
