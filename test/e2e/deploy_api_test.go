package e2e

import (
	"context"
	"fmt"
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
// deletes the config again, with the controller under its generated roles:
// it creates the API server's objects, among them a Role and a RoleBinding
// (it may, holding the Role's one right itself), and removes them.
// waitFor fails the test on any request the roles refuse.
func runAPIServerUnderControllerRBAC(t *testing.T, c client.Client, ns string, waitFor func(time.Duration, string, func() error)) {
	t.Helper()
	ctx := context.Background()
	cfg := &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}},
	}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatalf("failed to enable the API in %s: %v", ns, err)
	}
	key := client.ObjectKey{Namespace: ns, Name: config.APIName}
	waitFor(time.Minute, "the API server's Deployment, Role and RoleBinding", func() error {
		if err := c.Get(ctx, key, &appsv1.Deployment{}); err != nil {
			return err
		}
		if err := c.Get(ctx, key, &rbacv1.Role{}); err != nil {
			return err
		}
		rb := &rbacv1.RoleBinding{}
		if err := c.Get(ctx, key, rb); err != nil {
			return err
		}
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != config.APIName {
			return fmt.Errorf("RoleBinding %s grants %+v", config.APIName, rb.RoleRef)
		}
		return nil
	})
	if err := c.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(time.Minute, "the config gone, and the API server's Role with it", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cfg), &terracev1.TerraceConfig{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the TerraceConfig is still there (%v)", err)
		}
		if err := c.Get(ctx, key, &rbacv1.Role{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Role is still there (%v)", err)
		}
		return nil
	})
}
