package apiserver

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/testenv"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestRegisteredClusters: a second control plane registered by the
// operator (Server.Clusters, the operator namespace's spec.api.clusters)
// gets the installation of a request that names it, made with the caller's
// token of that cluster; an unknown cluster is INVALID_ARGUMENT naming the
// known ones, and nothing is made anywhere.
func TestRegisteredClusters(t *testing.T) {
	second, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Stop() })
	at := newAPITestWith(t, func(s *Server) {
		s.Clusters = []terracev1.APICluster{{Name: "second", Server: second.Config.Host, CABundle: string(second.Config.CAData)}}
	})
	ctx := context.Background()
	if err := second.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: at.namespace}}); err != nil {
		t.Fatal(err)
	}
	secondCS, err := kubernetes.NewForConfig(second.Config)
	if err != nil {
		t.Fatal(err)
	}
	there := serviceAccountToken(t, secondCS, at.namespace, "installer", installerRules)

	grpc := at.grpcClient()
	created, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Cluster: "second", Name: "web", Source: &apiv1.Source{ProgramRef: "m"},
		Values: mustStruct(t, map[string]any{"n": 1})}, there))
	if err != nil {
		t.Fatal(err)
	}
	if created.Msg.Cluster != "second" {
		t.Fatalf("created: %v", created.Msg)
	}
	stack := &terracev1.Stack{}
	if err := second.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: "web"}, stack); err != nil {
		t.Fatalf("the Stack is not in the second cluster: %v", err)
	}
	values := &corev1.Secret{}
	if err := second.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: stack.Spec.VarsFrom[0].Name}, values); err != nil || string(values.Data["n"]) != "1" {
		t.Fatalf("the values Secret in the second cluster: %v %q", err, values.Data)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: "web"}, &terracev1.Stack{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Stack was made in the server's own cluster: %v", err)
	}
	list, err := grpc.List(ctx, withToken(&apiv1.ListRequest{Cluster: "second"}, there))
	if err != nil || len(list.Msg.Items) != 1 || list.Msg.Items[0].Cluster != "second" {
		t.Fatalf("list in second: %v %v", list, err)
	}
	// A token of the server's own cluster is not one of the second's.
	_, err = grpc.Get(ctx, withToken(&apiv1.GetRequest{Cluster: "second", Name: "web"}, at.admin))
	expectCode(t, err, connect.CodeUnauthenticated, reasonUnauthenticated, "was not accepted")

	_, err = grpc.Create(ctx, withToken(&apiv1.CreateRequest{Cluster: "third", Name: "db", Source: &apiv1.Source{ProgramRef: "m"},
		Values: mustStruct(t, map[string]any{"n": 1})}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonUnknownCluster, "cluster third is not known", "the known ones are second")
	for name, c := range map[string]client.Client{"own": env.Client, "second": second.Client} {
		stacks := &terracev1.StackList{}
		if err := c.List(ctx, stacks, client.InNamespace(at.namespace)); err != nil {
			t.Fatal(err)
		}
		secrets := &corev1.SecretList{}
		if err := c.List(ctx, secrets, client.InNamespace(at.namespace), client.HasLabels{InstallationLabel}); err != nil {
			t.Fatal(err)
		}
		for _, s := range stacks.Items {
			if s.Name == "db" {
				t.Fatalf("the refused create made Stack db in the %s cluster", name)
			}
		}
		if want := map[string]int{"own": 0, "second": 1}[name]; len(secrets.Items) != want {
			t.Fatalf("%d values Secrets in the %s cluster, want %d", len(secrets.Items), name, want)
		}
	}
}

// TestANamespaceConfigRegistersNoClusterForTokens is the attack of issue 44
// item 3: a namespace admin registers, in their own TerraceConfig, a
// "cluster" whose server is a host of theirs, hoping that callers who name
// it send their bearer tokens there. The server knows only the operator's
// clusters: the call is INVALID_ARGUMENT (UNKNOWN_CLUSTER) naming them, and
// the tenant's host receives nothing.
func TestANamespaceConfigRegistersNoClusterForTokens(t *testing.T) {
	var received atomic.Int32
	var tokens sync.Map
	tenantHost := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		tokens.Store(r.Header.Get("Authorization"), true)
		http.Error(w, "collected", http.StatusUnauthorized)
	}))
	t.Cleanup(tenantHost.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tenantHost.Certificate().Raw})

	at := newAPITestWith(t, func(s *Server) {
		s.Clusters = []terracev1.APICluster{{Name: "registered", Server: "https://registered.invalid:6443"}}
	})
	ctx := context.Background()
	if err := env.Client.Create(ctx, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Clusters: []terracev1.APICluster{
			{Name: "prod", Server: tenantHost.URL, CABundle: string(caPEM)},
		}}},
	}); err != nil {
		t.Fatal(err)
	}
	grpc := at.grpcClient()
	_, err := grpc.List(ctx, withToken(&apiv1.ListRequest{Cluster: "prod"}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonUnknownCluster, "cluster prod is not known", "the known ones are registered")
	_, err = grpc.Create(ctx, withToken(&apiv1.CreateRequest{Cluster: "prod", Name: "web", Source: &apiv1.Source{ProgramRef: "m"},
		Values: mustStruct(t, map[string]any{"n": 1})}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonUnknownCluster, "cluster prod is not known")
	code, _ := at.do(at.admin, http.MethodGet, "/v1/installations?cluster=prod", nil)
	if code != http.StatusBadRequest {
		t.Errorf("REST with cluster=prod: status %d, want 400", code)
	}
	if n := received.Load(); n != 0 {
		tokens.Range(func(k, _ any) bool { t.Logf("the tenant's host got %q", k); return true })
		t.Fatalf("the tenant's host received %d requests", n)
	}
}

// TestParseClusters: the controller's --clusters JSON, and what a server
// started by hand is refused.
func TestParseClusters(t *testing.T) {
	got, err := ParseClusters(`[{"name":"second","server":"https://second.example:6443","namespace":"team"}]`)
	if err != nil || len(got) != 1 || got[0].Name != "second" || got[0].Namespace != "team" {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	if got, err := ParseClusters("[]"); err != nil || len(got) != 0 {
		t.Fatalf("[]: %+v, %v", got, err)
	}
	for _, bad := range []string{
		`{`,
		`[{"name":"a","server":"http://a.example"}]`,
		`[{"name":"","server":"https://a.example"}]`,
		`[{"name":"a","server":"https://a.example"},{"name":"a","server":"https://b.example"}]`,
	} {
		if _, err := ParseClusters(bad); err == nil {
			t.Errorf("%s was accepted", bad)
		}
	}
}
