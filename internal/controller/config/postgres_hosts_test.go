package config

import (
	"strings"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// The attack: a namespace admin names a PostgreSQL server the operator did
// not allow (an internal address, a unix socket). The config is Stalled
// with PostgresHostNotAllowed naming the host and the flag, without the
// password; naming an allowed server makes it Ready. (The suite's
// controller allows "db", as --postgres-allowed-hosts=db would.)
func TestNamespaceConfigNamingADisallowedPostgresHostIsRefused(t *testing.T) {
	ns := env.Namespace(t)
	putSecret(t, ns, "pg", map[string][]byte{"url": []byte("postgres://terrace:hunter2@10.1.2.3:5432/terrace")})
	createConfig(t, ns, terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Backend:  terracev1.StateBackendPostgres,
		Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
	}})
	c := waitForConfig(t, ns, "stalled on a host the operator did not allow", stalledWith(PostgresHostNotAllowedReason))
	msg := readyMessage(c)
	if !strings.Contains(msg, "10.1.2.3:5432") || !strings.Contains(msg, "--postgres-allowed-hosts") || strings.Contains(msg, "hunter2") {
		t.Errorf("message %q should name the host and the flag, never the password", msg)
	}

	putSecret(t, ns, "pg", map[string][]byte{"url": []byte("postgres://terrace:hunter2@/terrace?host=/var/run/postgresql")})
	c = waitForConfig(t, ns, "stalled on a unix socket", func(c *terracev1.TerraceConfig) bool {
		return stalledWith(PostgresHostNotAllowedReason)(c) && strings.Contains(readyMessage(c), "unix socket")
	})
	if msg := readyMessage(c); strings.Contains(msg, "hunter2") {
		t.Errorf("message %q quotes the password", msg)
	}

	putSecret(t, ns, "pg", map[string][]byte{"url": []byte("postgres://terrace:hunter2@db:5432/terrace")})
	waitForConfig(t, ns, "ready on the allowed server", readyWithBackend(terracev1.StateBackendPostgres))
}
