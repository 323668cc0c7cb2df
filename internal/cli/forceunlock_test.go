package cli

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

func TestForceUnlockIsRefusedWhileARunMayHoldTheLock(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	stack := newStack(t, ns, "web", nil, readyAt(2))
	states := secrets.New(env.Client, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "web", Workspace: "default"}

	out, _, err := verb(t, "force-unlock", "web", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "unlocked state", out, "is not locked")

	lock := state.LockInfo{ID: "lock-1", Operation: "OperationTypeApply", Who: "runner@web-run-7", Created: time.Now().Add(-time.Hour)}
	if err := states.Lock(ctx, key, lock); err != nil {
		t.Fatal(err)
	}
	// A pending runner pod of the Stack: its run may hold the lock.
	pod := runnerPod("web-run-7", "web", stack.UID, corev1.PodPending, time.Now())
	pod.Namespace = ns
	pod.Spec.Containers = []corev1.Container{{Name: runnerContainer, Image: "terrace"}}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = verb(t, "force-unlock", "web", "-n", ns)
	mustFail(t, err, "refused: runner pod web-run-7", "lock lock-1", "held by runner@web-run-7", "(60m ago)")
	if held, _ := states.GetLock(ctx, key); held == nil {
		t.Fatal("a refused force-unlock released the lock")
	}

	// The run is gone: a wrong id is refused, the right one releases it.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	_, _, err = verb(t, "force-unlock", "web", "lock-0", "-n", ns)
	mustFail(t, err, "locked by another lock than lock-0", "lock lock-1")
	out, _, err = verb(t, "force-unlock", "web", "lock-1", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "force-unlock", out, "released the state lock of Stack "+ns+"/web: lock lock-1")
	if held, err := states.GetLock(ctx, key); err != nil || held != nil {
		t.Fatalf("after force-unlock the lock is %+v (%v)", held, err)
	}
}
