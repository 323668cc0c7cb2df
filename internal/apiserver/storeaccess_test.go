package apiserver

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/release"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestStoresOpenedForOneCallerServeNoOther is the attack of issue 44 item
// 9: a namespace keeps its releases in PostgreSQL; a caller who may read
// them (and the connection Secret) lists them, which opens the pool the
// server then keeps; right after, callers who could never have opened it
// ask for the same releases. A caller who may only get Stacks, and one who
// may list Secrets but not read the connection string, are refused with
// PERMISSION_DENIED naming what they lack, and read nothing through the
// pool; the first caller still reads them. (Before, both got the release
// records, outputs included, for the 30 s the opened stores were kept.)
func TestStoresOpenedForOneCallerServeNoOther(t *testing.T) {
	url, stop, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	at := newAPITest(t)
	ctx := context.Background()
	ns := at.namespace

	for _, obj := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pg"}, Data: map[string][]byte{"url": []byte(url)}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: backend.LocationSecretName}, Type: backend.LocationSecretType, Data: map[string][]byte{"backend": []byte(terracev1.StateBackendPostgres)}},
	} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
			Backend:  terracev1.StateBackendPostgres,
			Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	grpc := at.grpcClient()
	if _, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}, Values: mustStruct(t, map[string]any{"n": 1})}, at.admin)); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := postgres.New(ctx, pool, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	at1 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	if _, err := (release.History{Store: store}).Record(ctx, release.Release{
		Namespace: ns, Stack: "web", Status: release.StatusDeployed, SourceRevision: "main@sha1:aaa",
		Outputs:   []release.Output{{Name: "endpoint", Value: json.RawMessage(`"https://db.internal:5432"`)}},
		StartedAt: at1, FinishedAt: at1.Add(time.Minute),
	}); err != nil {
		t.Fatal(err)
	}

	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	viewer := serviceAccountToken(t, cs, ns, "viewer", []rbacv1.PolicyRule{
		{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch"}},
	})
	lister := serviceAccountToken(t, cs, ns, "lister", []rbacv1.PolicyRule{
		{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{backend.LocationSecretName}},
	})

	// The privileged read opens the pool (and records where the state is).
	list, err := grpc.ListReleases(ctx, withToken(&apiv1.ListReleasesRequest{Name: "web"}, at.admin))
	if err != nil || len(list.Msg.Items) != 1 {
		t.Fatalf("the installer's releases: %v %v", list, err)
	}

	_, err = grpc.ListReleases(ctx, withToken(&apiv1.ListReleasesRequest{Name: "web"}, viewer))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, `User "system:serviceaccount:`+ns+`:viewer" cannot list resource "secrets" in the namespace "`+ns+`"`)
	_, err = grpc.ListReleases(ctx, withToken(&apiv1.ListReleasesRequest{Name: "web"}, lister))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, `cannot get Secret "pg" in the namespace "`+ns+`"`, "release records")
	// The installer still reads them; the shared pool is kept.
	list, err = grpc.ListReleases(ctx, withToken(&apiv1.ListReleasesRequest{Name: "web"}, at.admin))
	if err != nil || len(list.Msg.Items) != 1 || list.Msg.Items[0].GetSourceRevision() != "main@sha1:aaa" {
		t.Fatalf("the installer's releases after the refusals: %v %v", list, err)
	}
}
