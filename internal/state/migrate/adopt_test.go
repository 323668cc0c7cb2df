package migrate_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

func gzipped(t *testing.T, data []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tofuControllerSecret writes a Secret the way the Terraform kubernetes
// backend does for tofu-controller.
func tofuControllerSecret(t *testing.T, ns, workspace, name string, stateJSON []byte) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: migrate.TofuControllerSecretName(workspace, name),
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "terraform", "tfstate": "true", "tfstateSecretSuffix": name, "tfstateWorkspace": workspace},
			Annotations: map[string]string{"encoding": "gzip"}},
		Data: map[string][]byte{"tfstate": gzipped(t, stateJSON)},
	}
	if err := env.Client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAdoptTofuControllerState(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	store := secrets.New(env.Client, secrets.Options{})
	data := storetest.StateJSON("tfctl-lineage", 17, 0, 700<<10)
	src := tofuControllerSecret(t, ns, "default", "my-infra", data)
	key := state.Key{Namespace: ns, Stack: "my-infra", Workspace: "default"}

	res, err := migrate.Adopt(ctx, env.Client, ns, src.Name, store, key)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if res.AlreadyAdopted || res.Meta.Serial != 17 || res.Meta.Lineage != "tfctl-lineage" {
		t.Fatalf("Adopt returned %+v", res)
	}
	got, err := store.Get(ctx, key)
	if err != nil || !bytes.Equal(got.Data, data) {
		t.Fatalf("adopted state differs: %v", err)
	}
	var after corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(src), &after); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(after.Annotations[migrate.AnnotationAdoptedBy], key.String()+" ") || !bytes.Equal(after.Data["tfstate"], src.Data["tfstate"]) {
		t.Fatalf("source Secret after adoption: annotations %v", after.Annotations)
	}
	// Again: nothing to do. After an apply in Terrace: still nothing to do.
	if res, err := migrate.Adopt(ctx, env.Client, ns, src.Name, store, key); err != nil || !res.AlreadyAdopted {
		t.Fatalf("second Adopt: %+v, %v", res, err)
	}
	if _, err := store.Put(ctx, key, storetest.StateJSON("tfctl-lineage", 18, 1, 100), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := migrate.Adopt(ctx, env.Client, ns, src.Name, store, key); err != nil || !res.AlreadyAdopted || res.Meta.Serial != 18 {
		t.Fatalf("Adopt after a newer write: %+v, %v", res, err)
	}

	// Another lineage already in the store is never overwritten.
	other := tofuControllerSecret(t, ns, "default", "other", storetest.StateJSON("different", 3, 0, 100))
	if _, err := migrate.Adopt(ctx, env.Client, ns, other.Name, store, key); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("Adopt over another state: %v", err)
	}

	// A Secret whose Lease is held by a running tofu is not adopted.
	locked := tofuControllerSecret(t, ns, "prod", "busy", storetest.StateJSON("busy", 1, 0, 100))
	holder := "b6a3b0f4-lock"
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lock-" + locked.Name, Labels: map[string]string{"tfstate": "true"},
			Annotations: map[string]string{"app.terraform.io/lock-info": `{"ID":"` + holder + `","Operation":"OperationTypeApply","Who":"tf-runner"}`}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	_, err = migrate.Adopt(ctx, env.Client, ns, locked.Name, store, state.Key{Namespace: ns, Stack: "busy", Workspace: "prod"})
	var lockedErr *state.LockedError
	if !errors.As(err, &lockedErr) || lockedErr.Holder.ID != holder || lockedErr.Holder.Who != "tf-runner" {
		t.Fatalf("Adopt of a locked Secret: %v", err)
	}
}
