package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
)

// runAPIServerUnderControllerRBAC enables the Installations API in ns and
// disables it again, with the controller under its generated roles: it
// creates the API server's objects, adds the namespace to the installed
// ClusterRoleBinding terrace-api-auth (it may create none), and removes
// them. waitFor fails the test on any request the roles refuse.
func runAPIServerUnderControllerRBAC(t *testing.T, c client.Client, ns string, waitFor func(time.Duration, string, func() error)) {
	t.Helper()
	ctx := context.Background()
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: config.APIName, Namespace: ns}
	bound := func() (bool, error) {
		var crb rbacv1.ClusterRoleBinding
		if err := c.Get(ctx, client.ObjectKey{Name: config.APIAuthBindingName}, &crb); err != nil {
			return false, fmt.Errorf("the installed ClusterRoleBinding: %w", err)
		}
		return slices.Contains(crb.Subjects, subject), nil
	}
	cfg := &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}},
	}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatalf("failed to enable the API in %s: %v", ns, err)
	}
	waitFor(time.Minute, "the API server's Deployment and its cluster-wide binding", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.APIName}, &appsv1.Deployment{}); err != nil {
			return err
		}
		if ok, err := bound(); err != nil || !ok {
			return fmt.Errorf("ServiceAccount %s/%s not among the subjects of %s (%v)", ns, config.APIName, config.APIAuthBindingName, err)
		}
		return nil
	})
	if err := c.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(time.Minute, "the config gone and its namespace out of the binding", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cfg), &terracev1.TerraceConfig{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the TerraceConfig is still there (%v)", err)
		}
		if ok, err := bound(); err != nil || ok {
			return errors.Join(err, fmt.Errorf("ServiceAccount %s/%s still bound", ns, config.APIName))
		}
		return nil
	})
}
