package config

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
)

func conditionIs(c *terracev1.TerraceConfig, condType string, status metav1.ConditionStatus, reason string) bool {
	cond := reconcile.Get(c, condType)
	return cond != nil && cond.Status == status && (reason == "" || cond.Reason == reason)
}

// TestMissingKeySecretDoesNotBlockTheAPIServer: the concerns of a config
// are independent, so a missing encryption-key Secret stalls the config
// but the API server is still deployed and the state backend reported,
// each with its own condition.
func TestMissingKeySecretDoesNotBlockTheAPIServer(t *testing.T) {
	crb := installAPIAuthBinding(t)
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{
		State: &terracev1.StateConfig{Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "state-key"}}},
		API:   &terracev1.APIConfig{Enabled: true},
	})
	eventuallyObject(t, "the API Deployment despite the missing Secret", &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}, nil)
	eventuallyObject(t, "the API ServiceAccount bound despite the missing Secret", crb, apiSubject(crb, ns, true))
	c := waitForConfig(t, ns, "stalled on the Secret, with the API server and backend reported", func(c *terracev1.TerraceConfig) bool {
		return stalledWith(SecretNotFoundReason)(c) &&
			conditionIs(c, SecretsReadyCondition, metav1.ConditionFalse, SecretNotFoundReason) &&
			conditionIs(c, APIServerReadyCondition, metav1.ConditionTrue, APIServerDeployedReason) &&
			conditionIs(c, StateBackendReadyCondition, metav1.ConditionTrue, StateBackendCurrentReason)
	})
	if c.Status.StateBackend == nil || c.Status.StateBackend.Current != terracev1.StateBackendSecrets {
		t.Errorf("status.stateBackend = %+v, want the secrets backend", c.Status.StateBackend)
	}
	if msg := readyMessage(c); !strings.Contains(msg, ns+"/state-key") {
		t.Errorf("Ready message %q does not name the missing Secret", msg)
	}
}

// TestDeleteFailureReachesStatus: when removing a deleted config's API
// server fails, the config, kept by its finalizer, says why; once the
// cause is fixed it goes.
func TestDeleteFailureReachesStatus(t *testing.T) {
	installAPIAuthBinding(t)
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}})
	waitForConfig(t, ns, "Ready with the API server finalizer", func(c *terracev1.TerraceConfig) bool {
		return reconcile.IsTrue(c, terracev1.ReadyCondition) && slices.Contains(c.Finalizers, APIFinalizer)
	})

	// Replace the installed binding with one granting another role: the
	// controller refuses to edit it, so taking the namespace out fails.
	ctx := context.Background()
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: APIAuthBindingName}}
	if err := env.Client.Delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	eventuallyGone(t, "the installed binding", binding)
	wrong := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: APIAuthBindingName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
	}
	if err := env.Client.Create(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		_ = env.Client.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: APIAuthBindingName}})
		eventuallyGone(t, "the wrong binding", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: APIAuthBindingName}})
		installAPIAuthBinding(t)
	}
	t.Cleanup(func() {
		if wrong != nil {
			restore()
		}
	})

	if err := env.Client.Delete(ctx, tcfg(ns, terracev1.TerraceConfigSpec{})); err != nil {
		t.Fatal(err)
	}
	c := waitForConfig(t, ns, "deleting, Ready=False naming the failed removal", func(c *terracev1.TerraceConfig) bool {
		ready := reconcile.Get(c, terracev1.ReadyCondition)
		return !c.DeletionTimestamp.IsZero() && ready != nil && ready.Status == metav1.ConditionFalse &&
			strings.Contains(ready.Message, "reinstall it from config/rbac/api_roles.yaml") &&
			conditionIs(c, APIServerReadyCondition, metav1.ConditionFalse, "")
	})
	if !reconcile.IsTrue(c, terracev1.ReconcilingCondition) {
		t.Errorf("a failed removal is retried, so the config should be Reconciling: %+v", c.Status.Conditions)
	}

	restore()
	wrong = nil
	eventuallyGone(t, "the deleted TerraceConfig once the binding is fixed", tcfg(ns, terracev1.TerraceConfigSpec{}))
}

// TestAddingTheFinalizerKeepsLastHandledReconcileAt: a config created with
// a reconcile request gets the API server finalizer in the same reconcile
// that handles the request; the first status it reports must echo the
// request, which is how `terrace reconcile` knows it was acted on.
func TestAddingTheFinalizerKeepsLastHandledReconcileAt(t *testing.T) {
	installAPIAuthBinding(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watcher.Watch(ctx, &terracev1.TerraceConfigList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	const token = "2026-12-01T20:00:00Z"
	cfg := tcfg(ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}})
	cfg.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: token}
	if err := env.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), tcfg(ns, terracev1.TerraceConfigSpec{})) })

	// Every version the watch shows, up to the first with a Ready condition.
	for {
		select {
		case <-ctx.Done():
			t.Fatal("no status with a Ready condition was reported")
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended before a Ready condition was reported")
			}
			c, isConfig := ev.Object.(*terracev1.TerraceConfig)
			if !isConfig || reconcile.Get(c, terracev1.ReadyCondition) == nil {
				continue
			}
			if got := c.Status.LastHandledReconcileAt; got != token {
				t.Errorf("the first reported status has lastHandledReconcileAt %q, want %q", got, token)
			}
			if !slices.Contains(c.Finalizers, APIFinalizer) {
				t.Errorf("the first reported status comes without the finalizer: %v", c.Finalizers)
			}
			return
		}
	}
}

// TestDecisiveError: which kind of failure decides Ready, Reconciling and
// Stalled when several concerns fail, that every failure is named, and
// that the others are still retried.
func TestDecisiveError(t *testing.T) {
	terminal := reconcile.Terminalf(SecretNotFoundReason, "secret missing")
	waiting := reconcile.Waiting(StateMigratingReason, 5*time.Second, errors.New("runs in progress"))
	transient := errors.New("binding missing")
	for _, tc := range []struct {
		name         string
		errs         []error
		want         string // terminal, waiting, transient or none
		reason       string
		contains     []string
		retried      bool
		requeueAfter time.Duration
	}{
		{name: "none", errs: []error{nil, nil}, want: "none"},
		{name: "one terminal", errs: []error{nil, terminal}, want: "terminal", reason: SecretNotFoundReason, contains: []string{"secret missing"}},
		{name: "one wait", errs: []error{waiting, nil}, want: "waiting", reason: StateMigratingReason, requeueAfter: 5 * time.Second},
		{name: "terminal and transient: stalled, still retried", errs: []error{terminal, transient}, want: "terminal", reason: SecretNotFoundReason, contains: []string{"secret missing", "binding missing"}, retried: true},
		{name: "terminal and waiting: stalled, still rechecked", errs: []error{terminal, nil, waiting}, want: "terminal", reason: SecretNotFoundReason, contains: []string{"secret missing", "runs in progress"}, requeueAfter: 5 * time.Second},
		{name: "transient and waiting: retried", errs: []error{waiting, transient}, want: "transient", contains: []string{"runs in progress", "binding missing"}, retried: true},
		{name: "all three", errs: []error{waiting, terminal, transient}, want: "terminal", reason: SecretNotFoundReason, contains: []string{"runs in progress", "secret missing", "binding missing"}, retried: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decisive(tc.errs)
			var te *reconcile.TerminalError
			var we *reconcile.WaitingError
			got, reason := "transient", ""
			switch {
			case err == nil:
				got = "none"
			case errors.As(err, &te):
				got, reason = "terminal", te.Reason
			case errors.As(err, &we):
				got, reason = "waiting", we.Reason
			}
			if got != tc.want || reason != tc.reason {
				t.Fatalf("decisive = %v (%s %q), want %s %q", err, got, reason, tc.want, tc.reason)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not name %q", err, s)
				}
			}
			after, retryErr := retryOf(tc.errs)
			if (retryErr != nil) != tc.retried || (tc.retried && !errors.Is(retryErr, transient)) {
				t.Errorf("retryOf error = %v, want the transient error: %v", retryErr, tc.retried)
			}
			if after != tc.requeueAfter {
				t.Errorf("retryOf requeue = %s, want %s", after, tc.requeueAfter)
			}
		})
	}
}
