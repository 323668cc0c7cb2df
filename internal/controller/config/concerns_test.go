package config

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

func conditionIs(c *terracev1.TerraceConfig, condType string, status metav1.ConditionStatus, reason string) bool {
	cond := outcome.Get(c, condType)
	return cond != nil && cond.Status == status && (reason == "" || cond.Reason == reason)
}

// TestMissingKeySecretDoesNotBlockTheAPIServer: the concerns of a config
// are independent, so a missing encryption-key Secret stalls the config
// but the API server is still deployed and the state backend reported,
// each with its own condition.
func TestMissingKeySecretDoesNotBlockTheAPIServer(t *testing.T) {
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{
		State: &terracev1.StateConfig{Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "state-key"}}},
		API:   &terracev1.APIConfig{Enabled: true},
	})
	eventuallyObject(t, "the API Deployment despite the missing Secret", &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}, nil)
	eventuallyObject(t, "the API RoleBinding despite the missing Secret", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}, nil)
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
// cause is fixed it goes. An admission policy (CEL, in the API server)
// refuses to delete the API server's Service in the namespace.
func TestDeleteFailureReachesStatus(t *testing.T) {
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}})
	waitForConfig(t, ns, "Ready with the API server finalizer", func(c *terracev1.TerraceConfig) bool {
		return outcome.IsTrue(c, terracev1.ReadyCondition) && slices.Contains(c.Finalizers, APIFinalizer)
	})
	allow := refuseServiceDeletion(t, ns)

	if err := env.Client.Delete(context.Background(), tcfg(ns, terracev1.TerraceConfigSpec{})); err != nil {
		t.Fatal(err)
	}
	c := waitForConfig(t, ns, "deleting, Ready=False naming the failed removal", func(c *terracev1.TerraceConfig) bool {
		ready := outcome.Get(c, terracev1.ReadyCondition)
		return !c.DeletionTimestamp.IsZero() && ready != nil && ready.Status == metav1.ConditionFalse &&
			strings.Contains(ready.Message, "failed to remove *v1.Service terrace-api of the API server") &&
			strings.Contains(ready.Message, "the test keeps the API Service") &&
			conditionIs(c, APIServerReadyCondition, metav1.ConditionFalse, "")
	})
	if !outcome.IsTrue(c, terracev1.ReconcilingCondition) {
		t.Errorf("a failed removal is retried, so the config should be Reconciling: %+v", c.Status.Conditions)
	}

	allow()
	eventuallyGone(t, "the deleted TerraceConfig once deleting works", tcfg(ns, terracev1.TerraceConfigSpec{}))
}

// refuseServiceDeletion makes the API server refuse to delete the Service
// terrace-api in ns until the returned function (also run at cleanup)
// removes the policy.
func refuseServiceDeletion(t *testing.T, ns string) func() {
	t.Helper()
	ctx := context.Background()
	name := "keep-api-service-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "oldObject.metadata.name != '" + APIName + "'",
				Message:    "the test keeps the API Service",
			}},
		},
	}
	deny := admissionregistrationv1.Deny
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns},
			}},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	allow := func() {
		for _, obj := range []client.Object{binding, policy} {
			if err := env.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
	}
	t.Cleanup(allow)
	// The policy takes effect a moment after it is created: wait until a
	// dry-run delete is refused.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the policy in force", svc, func() error {
		if err := env.Client.Delete(ctx, svc, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "the test keeps the API Service") {
			return fmt.Errorf("a dry-run delete: %v", err)
		}
		return nil
	})
	return allow
}

// TestAddingTheFinalizerKeepsLastHandledReconcileAt: a config created with
// a reconcile request gets the API server finalizer in the same reconcile
// that handles the request; the first status it reports must echo the
// request, which is how `terrace reconcile` knows it was acted on.
func TestAddingTheFinalizerKeepsLastHandledReconcileAt(t *testing.T) {
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
			if !isConfig || outcome.Get(c, terracev1.ReadyCondition) == nil {
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
	terminal := outcome.Terminalf(SecretNotFoundReason, "secret missing")
	waiting := outcome.Waiting(StateMigratingReason, 5*time.Second, errors.New("runs in progress"))
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
			var te *outcome.TerminalError
			var we *outcome.WaitingError
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
