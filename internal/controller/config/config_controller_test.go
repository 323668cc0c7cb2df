package config

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/readiness"
)

const waitTimeout = 30 * time.Second

func configKey(ns string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: terracev1.TerraceConfigName}
}

func createConfig(t *testing.T, ns string, spec terracev1.TerraceConfigSpec) {
	t.Helper()
	if err := env.Client.Create(context.Background(), tcfg(ns, spec)); err != nil {
		t.Fatalf("failed to create terrace config: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), tcfg(ns, spec)) })
}

func putSecret(t *testing.T, ns, name string, data map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
	err := env.Client.Create(ctx, s)
	if apierrors.IsAlreadyExists(err) {
		err = env.Client.Update(ctx, s)
	}
	if err != nil {
		t.Fatalf("failed to write Secret %s/%s: %v", ns, name, err)
	}
}

// waitForConfig polls until cond holds for the config's latest state and returns it.
func waitForConfig(t *testing.T, ns, what string, cond func(c *terracev1.TerraceConfig) bool) *terracev1.TerraceConfig {
	t.Helper()
	var last *terracev1.TerraceConfig
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		c := &terracev1.TerraceConfig{}
		if err := env.Client.Get(ctx, configKey(ns), c); err != nil {
			return false, err
		}
		last = c
		return cond(c), nil
	})
	if err != nil {
		t.Fatalf("terrace config %s never became %s: %v; last status: %+v", ns, what, err, last.Status)
	}
	return last
}

func stalledWith(reason string) func(c *terracev1.TerraceConfig) bool {
	return func(c *terracev1.TerraceConfig) bool {
		ready := outcome.Get(c, terracev1.ReadyCondition)
		return c.Status.ObservedGeneration == c.Generation && outcome.IsTrue(c, terracev1.StalledCondition) &&
			ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == reason
	}
}

func readyWithBackend(backend terracev1.StateBackend) func(c *terracev1.TerraceConfig) bool {
	return func(c *terracev1.TerraceConfig) bool {
		ready, _, _ := readiness.ReadyAtGeneration(c)
		return ready && c.Status.StateBackend != nil && c.Status.StateBackend.Current == backend
	}
}

// readyMessage is the Ready condition's message; "" before there is one.
func readyMessage(c *terracev1.TerraceConfig) string {
	if ready := outcome.Get(c, terracev1.ReadyCondition); ready != nil {
		return ready.Message
	}
	return ""
}

func TestEncryptionKeySecretMissingThenFixed(t *testing.T) {
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "state-key"}},
	}})

	c := waitForConfig(t, ns, "stalled on the missing Secret", stalledWith(SecretNotFoundReason))
	if msg := readyMessage(c); !strings.Contains(msg, ns+"/state-key") || !strings.Contains(msg, `"key"`) {
		t.Errorf("message %q does not name the Secret and the key to create", msg)
	}
	if outcome.Get(c, terracev1.ReconcilingCondition) != nil {
		t.Error("a stalled config is also Reconciling")
	}

	putSecret(t, ns, "state-key", map[string][]byte{"other": []byte("x")})
	c = waitForConfig(t, ns, "stalled on the missing key", stalledWith(SecretKeyMissingReason))
	if msg := readyMessage(c); !strings.Contains(msg, `"key"`) {
		t.Errorf("message %q does not name the missing key", msg)
	}

	badKey := []byte("sixteen-byte-key")
	putSecret(t, ns, "state-key", map[string][]byte{"key": badKey})
	c = waitForConfig(t, ns, "stalled on the invalid key", stalledWith(InvalidEncryptionKeyReason))
	if msg := readyMessage(c); strings.Contains(msg, string(badKey)) || !strings.Contains(msg, "32 bytes") {
		t.Errorf("message %q quotes the key or does not say what is wrong", msg)
	}

	goodKey := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	putSecret(t, ns, "state-key", map[string][]byte{"key": []byte(goodKey)})
	c = waitForConfig(t, ns, "ready", readyWithBackend(terracev1.StateBackendSecrets))
	if ready, why, err := readiness.ReadyAtGeneration(c); err != nil || !ready {
		t.Errorf("not Ready at its generation as kstatus reads it: %s %v", why, err)
	}
	if outcome.Get(c, terracev1.StalledCondition) != nil {
		t.Error("Stalled is still set on a Ready config")
	}
	if msg := readyMessage(c); strings.Contains(msg, goodKey) {
		t.Errorf("Ready message %q quotes the key", msg)
	}
}

func TestPostgresConnectionIsChecked(t *testing.T) {
	ns := env.Namespace(t)
	secretURL := "postgres://terrace:hunter2@db:5432/x?sslmode=%zz"
	putSecret(t, ns, "pg", map[string][]byte{"dsn": []byte(secretURL)})
	createConfig(t, ns, terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Backend:  terracev1.StateBackendPostgres,
		Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg", Key: "dsn"}},
	}})
	c := waitForConfig(t, ns, "stalled on the invalid URL", stalledWith(InvalidPostgresConnectionReason))
	if msg := readyMessage(c); strings.Contains(msg, "hunter2") {
		t.Errorf("message %q quotes the connection string", msg)
	}

	putSecret(t, ns, "pg", map[string][]byte{"dsn": []byte("postgres://terrace:hunter2@db:5432/terrace")})
	c = waitForConfig(t, ns, "ready on postgres", readyWithBackend(terracev1.StateBackendPostgres))
	if msg := readyMessage(c); strings.Contains(msg, "hunter2") {
		t.Errorf("message %q quotes the connection string", msg)
	}
}

// A namespace config that sets no backend reports the operator config's,
// and follows it when it changes.
func TestNamespaceConfigFollowsTheOperatorDefault(t *testing.T) {
	ctx := context.Background()
	putSecret(t, opNS, "pg", map[string][]byte{"url": []byte("postgres://db/terrace")})
	createConfig(t, opNS, terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Backend:  terracev1.StateBackendPostgres,
		Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
	}})
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "team:1"}})
	waitForConfig(t, opNS, "ready on postgres", readyWithBackend(terracev1.StateBackendPostgres))
	c := waitForConfig(t, ns, "ready on the inherited postgres backend", readyWithBackend(terracev1.StateBackendPostgres))
	if msg := readyMessage(c); !strings.Contains(msg, opNS+"/default") || !strings.Contains(msg, ns+"/default") {
		t.Errorf("Ready message %q does not name both configs", msg)
	}

	op := &terracev1.TerraceConfig{}
	if err := env.Client.Get(ctx, configKey(opNS), op); err != nil {
		t.Fatal(err)
	}
	op.Spec.State.Backend = terracev1.StateBackendSecrets
	if err := env.Client.Update(ctx, op); err != nil {
		t.Fatal(err)
	}
	waitForConfig(t, ns, "ready on the secrets backend", readyWithBackend(terracev1.StateBackendSecrets))
}
