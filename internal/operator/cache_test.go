package operator

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The manager's cache keeps Secrets by identity only: the TerraceConfig
// controller's metadata watch of Secrets still sees each one appear and
// change, by namespace and name, and the cache holds none of their labels,
// annotations or owners.
func TestTheCacheKeepsSecretsByIdentityOnly(t *testing.T) {
	env := sharedRBACEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultTransform: cache.TransformStripManagedFields(), ByObject: cacheByObject(shard{})})
	if err != nil {
		t.Fatal(err)
	}
	secretMeta := &metav1.PartialObjectMetadata{}
	secretMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	informer, err := c.GetInformer(ctx, secretMeta)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 16)
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { seen <- "add " + obj.(client.Object).GetName() },
		UpdateFunc: func(_, obj any) { seen <- "update " + obj.(client.Object).GetName() },
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cache-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "postgres", Namespace: ns.Name,
			Labels:          map[string]string{"team": "a"},
			Annotations:     map[string]string{"note": "a long annotation that the cache has no use for"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: "5c1e5a3e-0000-4000-8000-000000000001"}},
		},
		StringData: map[string]string{"url": "postgres://example.invalid/db"},
	}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, seen, "add postgres")
	sec.StringData = map[string]string{"url": "postgres://example.invalid/other"}
	if err := env.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, seen, "update postgres")

	cached := &metav1.PartialObjectMetadata{}
	cached.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := c.Get(ctx, client.ObjectKeyFromObject(sec), cached); err != nil {
		t.Fatal(err)
	}
	if cached.Name != "postgres" || cached.Namespace != ns.Name || cached.UID != sec.UID || cached.ResourceVersion != sec.ResourceVersion {
		t.Errorf("cached identity %s/%s uid %s rv %s; want %s/postgres uid %s rv %s", cached.Namespace, cached.Name, cached.UID, cached.ResourceVersion, ns.Name, sec.UID, sec.ResourceVersion)
	}
	if len(cached.Labels)+len(cached.Annotations)+len(cached.OwnerReferences)+len(cached.ManagedFields) > 0 {
		t.Errorf("the cache kept more than the Secret's identity: labels %v, annotations %v, owners %v, %d managedFields entries",
			cached.Labels, cached.Annotations, cached.OwnerReferences, len(cached.ManagedFields))
	}
}

func waitFor(t *testing.T, seen <-chan string, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case got := <-seen:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q event within 30 s", want)
		}
	}
}

// Another kind's object passes through with only its managedFields gone.
func TestKeepSecretIdentityLeavesOtherObjects(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"a": "b"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	out, err := keepSecretIdentity(pod)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	if got.Labels["a"] != "b" || len(got.ManagedFields) != 0 {
		t.Errorf("labels %v, %d managedFields entries; want the labels kept, managedFields dropped", got.Labels, len(got.ManagedFields))
	}
}
