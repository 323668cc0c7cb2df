package e2e

// Tenancy attacks on storage (issue 10, items 7 and 8): Secret values of any
// type and length never leave the run in clear; sealed state does not move
// between Stacks; a namespace's TerraceConfig cannot point the controller at
// any PostgreSQL server.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/tf"
)

// sharedPostgresDir is the directory (and unix socket directory) of the
// shared PostgreSQL, chosen before the controller starts so the harness can
// allow it (--postgres-allowed-hosts) before the server exists.
var sharedPostgresDir = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("/tmp", "terrace-pg.")
	if err != nil {
		return ""
	}
	return dir
})

// sharedPostgresHost is what the harness's controller allows namespace
// configs to use: the shared PostgreSQL's socket directory, or the host of
// TERRACE_TEST_POSTGRES_URL.
func sharedPostgresHost(t testing.TB) string {
	t.Helper()
	url := os.Getenv("TERRACE_TEST_POSTGRES_URL")
	if url == "" {
		return sharedPostgresDir()
	}
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatalf("TERRACE_TEST_POSTGRES_URL does not parse")
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return cfg.Host
	}
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}

// echoModule passes Secret values on through outputs it does not declare
// sensitive, a string template and a terraform_data input, so tofu marks
// none of them.
var echoModule = map[string]string{"main.tf": `
variable "pin" {}
variable "flag" {}
variable "short" {}
variable "label" { default = "visible-label" }
resource "terraform_data" "echo" {
  input = { pin = var.pin, flag = var.flag, short = var.short, label = var.label }
}
output "echo_pin"   { value = var.pin }
output "echo_flag"  { value = var.flag }
output "echo_short" { value = var.short }
output "echo_text"  { value = "pin=${var.pin} flag=${var.flag} short=${var.short}" }
output "echo_data"  { value = terraform_data.echo.output }
output "label"      { value = var.label }
`}

// secretTokens finds pin 7, flag true and short ab standing alone, as the
// redactor would mask them.
var secretTokens = regexp.MustCompile(`(^|[^\w])(7|true|ab)([^\w]|$)`)

// echoedNames finds the log lines about the echoed values.
var echoedNames = regexp.MustCompile(`\b(pin|flag|short|echo_\w+)\b`)

// The attack: a Stack author puts a number, a boolean and a two-letter
// string in a Secret and echoes them through outputs the module does not
// declare sensitive. None of them appears in the runner's log, the stored
// readable plan, events, conditions or the release record; a value that
// came from no Secret stays readable.
func TestSecretValuesOfAnyTypeAndLengthStayMasked(t *testing.T) {
	e := newStackEnv(t)
	e.allowRunnerToRead(t, "pins")
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pins"}, StringData: map[string]string{"pin": "7", "flag": "true", "short": "ab"}})
	e.create(t, &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Retain: ptrTo(true)}}})
	e.program(t, "echo", echoModule)
	e.create(t, &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "echo"}, Spec: terracev1.StackSpec{
		Source:            terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "echo"}},
		VarsFrom:          []terracev1.VarsReference{{Kind: "Secret", Name: "pins"}},
		StoreReadablePlan: terracev1.ReadablePlanJSON,
		Interval:          &metav1.Duration{Duration: time.Hour},
		RetryInterval:     &metav1.Duration{Duration: 2 * time.Second},
	}})
	st := e.waitStack(t, "echo", stackTimeout, "a plan waiting for approval", func(s *terracev1.Stack) error {
		if s.Status.Plan == nil || s.Status.Plan.Pending == "" {
			return fmt.Errorf("no pending plan; conditions: %s", conditionsText(s))
		}
		return nil
	})
	planID := st.Status.Plan.Pending
	e.assertReadablePlanMasked(t, "echo", planID)
	// retain keeps only a Stack's latest runner pod: read the planning
	// run's log before the apply run replaces it.
	logs := map[string]string{}
	e.collectRunnerLogs(t, "echo", logs)

	e.updateStack(t, "echo", func(s *terracev1.Stack) { s.Spec.ApprovePlan = planID })
	st = e.waitStack(t, "echo", stackTimeout, "Ready after the approved apply", readyAt)

	rs := e.releases(t, "echo")
	if len(rs) != 1 {
		t.Fatalf("releases: %+v", rs)
	}
	for _, o := range rs[0].Outputs {
		switch o.Name {
		case "label":
			if string(o.Value) != `"visible-label"` {
				t.Errorf("the output from no Secret lost its value: %s", o.Value)
			}
		default:
			if o.Value != nil || !o.Sensitive || !o.FromSecret {
				t.Errorf("release record keeps %s = %s (sensitive %v, fromSecret %v)", o.Name, o.Value, o.Sensitive, o.FromSecret)
			}
		}
	}

	var texts []string
	for _, c := range st.Status.Conditions {
		texts = append(texts, "condition "+c.Type+": "+c.Message)
	}
	var events eventsv1.EventList
	if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		texts = append(texts, "event "+ev.Reason+": "+ev.Note)
	}
	for _, text := range texts {
		if secretTokens.MatchString(text) {
			t.Errorf("a Secret value appears in %q", text)
		}
	}
	e.collectRunnerLogs(t, "echo", logs)
	assertRunnerLogsMasked(t, logs)
}

// assertReadablePlanMasked reads the stored readable plan and checks every
// place the module put a Secret value.
func (e *stackEnv) assertReadablePlanMasked(t *testing.T, stack, planID string) {
	t.Helper()
	plan, err := secrets.New(e.c, secrets.Options{}).GetPlan(context.Background(), state.PlanKey{Namespace: e.ns, Stack: stack, ID: planID})
	if err != nil || plan.Readable == nil {
		t.Fatalf("readable plan of %s: %v", planID, err)
	}
	var p struct {
		OutputChanges   map[string]struct{ After any } `json:"output_changes"`
		ResourceChanges []struct {
			Change struct {
				After struct {
					Input map[string]any `json:"input"`
				} `json:"after"`
			} `json:"change"`
		} `json:"resource_changes"`
	}
	if err := json.Unmarshal(plan.Readable, &p); err != nil {
		t.Fatalf("readable plan is not JSON: %v", err)
	}
	for _, name := range []string{"echo_pin", "echo_flag", "echo_short"} {
		if got := p.OutputChanges[name].After; got != tf.Redacted {
			t.Errorf("readable plan: output %s = %v", name, got)
		}
	}
	if got, _ := p.OutputChanges["echo_text"].After.(string); secretTokens.MatchString(got) {
		t.Errorf("readable plan: output echo_text = %q", got)
	}
	if len(p.ResourceChanges) != 1 {
		t.Fatalf("readable plan has %d resource changes", len(p.ResourceChanges))
	}
	input := p.ResourceChanges[0].Change.After.Input
	for _, k := range []string{"pin", "flag", "short"} {
		if input[k] != tf.Redacted {
			t.Errorf("readable plan: terraform_data input %s = %v", k, input[k])
		}
	}
	if input["label"] != "visible-label" {
		t.Errorf("readable plan lost the value from no Secret: %v", input["label"])
	}
	// Whole values anywhere else (variables, planned values, configuration).
	for _, raw := range []string{`"ab"`, `:7,`, `:7}`, `=7`, `=true`} {
		if bytes.Contains(plan.Readable, []byte(raw)) {
			t.Errorf("readable plan holds %s", raw)
		}
	}
}

// collectRunnerLogs adds the logs of the Stack's runner pods (kept by
// retain) to logs, by pod name, as `terrace logs` reads them.
func (e *stackEnv) collectRunnerLogs(t *testing.T, stack string, logs map[string]string) {
	t.Helper()
	var pods corev1.PodList
	if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.MatchingLabels{"terrace.dev/stack": stack}); err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp != nil {
			continue
		}
		text, err := podLogs(context.Background(), e.cs, e.ns, pod.Name, &corev1.PodLogOptions{Container: "runner"})
		if err != nil {
			t.Fatalf("log of runner pod %s: %v", pod.Name, err)
		}
		logs[pod.Name] = text
	}
}

// assertRunnerLogsMasked checks that every line about the echoed values
// shows them masked, in the logs of both the planning and the applying run.
func assertRunnerLogsMasked(t *testing.T, logs map[string]string) {
	t.Helper()
	if len(logs) < 2 {
		t.Errorf("read the logs of %d runner pods, want the planning and the applying one", len(logs))
	}
	// The planning run logs tofu's plan messages ("Plan to create"), which
	// carry no values; the applying run logs the outputs. So it is across
	// the pods that the values must be mentioned, masked, for the check to
	// check something.
	mentions, masked := 0, 0
	var all []string
	for pod, text := range logs {
		for _, line := range strings.Split(text, "\n") {
			if !echoedNames.MatchString(line) {
				continue
			}
			mentions++
			if strings.Contains(line, tf.Redacted) {
				masked++
			}
			if secretTokens.MatchString(line) {
				t.Errorf("runner pod %s logs a Secret value: %q", pod, line)
			}
		}
		all = append(all, lastLines(text, 20))
	}
	if mentions == 0 || masked == 0 {
		t.Errorf("no runner pod logs the echoed values (%d lines, %d masked): the check checks nothing\n%s", mentions, masked, strings.Join(all, "\n---\n"))
	}
}

// encryptedNamespace gives e's namespace a TerraceConfig that encrypts state.
func (e *stackEnv) encryptedNamespace(t *testing.T) {
	t.Helper()
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "state-key"}, StringData: map[string]string{"key": "0123456789abcdef0123456789abcdef"}})
	e.create(t, &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName}, Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "state-key"}},
	}}})
}

func (e *stackEnv) stateIndex(t *testing.T, stack string) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: secrets.ObjectName("terrace-state", stack, "default")}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func (e *stackEnv) setStateIndex(t *testing.T, stack string, index []byte) {
	t.Helper()
	s := e.stateIndex(t, stack)
	s.Data["index"] = index
	if err := e.c.Update(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func (e *stackEnv) requestReconcile(t *testing.T, stack string) string {
	t.Helper()
	requested := time.Now().UTC().Format(time.RFC3339Nano)
	e.updateStack(t, stack, func(s *terracev1.Stack) {
		s.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: requested}
	})
	return requested
}

// The attack: someone who may write Secrets in the namespace (not read the
// key) points Stack B's encrypted state at Stack A's chunks, whose digests
// and sizes all match. B's next run fails instead of planning against A's
// resources; neither state changes; restoring B's own index recovers B.
func TestStateChunksCopiedBetweenStacksAreRefused(t *testing.T) {
	e := newStackEnv(t)
	e.encryptedNamespace(t)
	e.program(t, "echo", map[string]string{"main.tf": `
variable "name" {}
resource "terraform_data" "this" { input = var.name }
output "name" { value = terraform_data.this.output }
`})
	for _, name := range []string{"a", "b"} {
		e.create(t, &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "echo"}},
			Vars:          jsonVars(t, map[string]any{"name": "stack-" + name}),
			ApprovePlan:   terracev1.ApprovePlanAuto,
			Interval:      &metav1.Duration{Duration: time.Hour},
			RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
		}})
	}
	for _, name := range []string{"a", "b"} {
		e.waitStack(t, name, stackTimeout, "Ready", readyAt)
	}
	stateA, _ := e.stateOfKey(t, "a")
	indexA := bytes.Clone(e.stateIndex(t, "a").Data["index"])
	indexB := bytes.Clone(e.stateIndex(t, "b").Data["index"])

	e.setStateIndex(t, "b", indexA)
	requested := e.requestReconcile(t, "b")
	st := e.waitStack(t, "b", stackTimeout, "B's run refused", func(s *terracev1.Stack) error {
		if s.Status.LastHandledReconcileAt != requested {
			return fmt.Errorf("request not handled yet")
		}
		if c := outcome.Get(s, terracev1.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(strings.ToLower(c.Message), "state") {
			return fmt.Errorf("not failing on its state: %s", conditionsText(s))
		}
		return nil
	})
	t.Logf("B's Ready condition: %s", outcome.Get(st, terracev1.ReadyCondition).Message)
	if !strings.Contains(controllerLog.String(), "not sealed for state "+e.ns+"/b/default") {
		t.Errorf("the controller log does not say B's state was not sealed for B")
	}
	if got := e.stateIndex(t, "b").Data["index"]; !bytes.Equal(got, indexA) {
		t.Errorf("the refused run wrote B's state")
	}
	if got := e.stateIndex(t, "a").Data["index"]; !bytes.Equal(got, indexA) {
		t.Errorf("A's state changed")
	}
	if now, _ := e.stateOfKey(t, "a"); now.Serial != stateA.Serial || now.Lineage != stateA.Lineage {
		t.Errorf("A's state changed: serial %d→%d", stateA.Serial, now.Serial)
	}

	e.setStateIndex(t, "b", indexB)
	requested = e.requestReconcile(t, "b")
	st = e.waitStack(t, "b", stackTimeout, "B recovered with its own state", func(s *terracev1.Stack) error {
		if s.Status.LastHandledReconcileAt != requested {
			return fmt.Errorf("request not handled yet")
		}
		return readyAt(s)
	})
	if c := conditionIs(terracev1.PlannedCondition, metav1.ConditionTrue, "NoChanges")(st); c != nil {
		t.Errorf("B planned changes after recovering, as if its state were lost: %v", c)
	}
}

// stateOfKey reads a Stack's state with the namespace's encryption key.
func (e *stackEnv) stateOfKey(t *testing.T, stack string) (*state.State, error) {
	t.Helper()
	key := secrets.KeyFromSecret(e.c, e.ns, "state-key", "key")
	st, err := secrets.New(e.c, secrets.Options{Keys: key}).Get(context.Background(), state.Key{Namespace: e.ns, Stack: stack, Workspace: "default"})
	if err != nil {
		t.Fatalf("state of %s: %v", stack, err)
	}
	return st, nil
}

// The attack: a namespace admin points their TerraceConfig at a server on
// the controller's loopback, or at a unix socket. The config and the Stack
// report the refusal; the controller never connects (the listeners accept
// nothing); another namespace keeps applying.
func TestNamespaceConfigCannotPointTheControllerAtAnyPostgres(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "pg-sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	sock, err := net.Listen("unix", filepath.Join(sockDir, ".s.PGSQL.5432"))
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	for _, l := range []net.Listener{tcp, sock} {
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				_ = c.Close()
			}
		}()
	}

	for name, url := range map[string]string{
		"loopback":    "postgres://terrace:hunter2@" + tcp.Addr().String() + "/terrace?connect_timeout=2",
		"unix socket": "postgres://terrace:hunter2@/terrace?host=" + sockDir + "&connect_timeout=2",
	} {
		t.Run(name, func(t *testing.T) {
			e := newStackEnv(t)
			e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg"}, StringData: map[string]string{"url": url}})
			e.create(t, &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName}, Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Backend:  terracev1.StateBackendPostgres,
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
			}}})
			e.program(t, "files", map[string]string{"main.tf": `resource "terraform_data" "x" { input = "x" }`})
			e.create(t, &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "refused"}, Spec: terracev1.StackSpec{
				Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "files"}},
				ApprovePlan: terracev1.ApprovePlanAuto,
			}})
			eventually(t, stackTimeout, "the TerraceConfig to report the refused host", func() error {
				var cfg terracev1.TerraceConfig
				if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: terracev1.TerraceConfigName}, &cfg); err != nil {
					return err
				}
				c := outcome.Get(&cfg, terracev1.ReadyCondition)
				if c == nil || c.Reason != config.PostgresHostNotAllowedReason {
					return fmt.Errorf("Ready = %+v", c)
				}
				if strings.Contains(c.Message, "hunter2") {
					t.Fatalf("the condition quotes the password: %s", c.Message)
				}
				return nil
			})
			st := e.waitStack(t, "refused", stackTimeout, "the Stack to report the refused host", func(s *terracev1.Stack) error {
				c := outcome.Get(s, terracev1.ReadyCondition)
				if c == nil || c.Reason != "StateBackendMisconfigured" || !strings.Contains(c.Message, "--postgres-allowed-hosts") {
					return fmt.Errorf("conditions: %s", conditionsText(s))
				}
				return nil
			})
			if msg := outcome.Get(st, terracev1.ReadyCondition).Message; strings.Contains(msg, "hunter2") {
				t.Errorf("the Stack's condition quotes the password: %s", msg)
			}
		})
	}

	assertStillServing(t)
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the controller connected %d times to refused servers", n)
	}
}
