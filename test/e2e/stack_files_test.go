package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// filesClaim is the PersistentVolumeClaim, in each test namespace that asks
// for one (runnerDir), of the host directory runners share with the test.
const filesClaim = "files"

// managedFile returns the path of a file the test provider may manage for
// the namespace's Stacks, in the runnerDir.
func (e *stackEnv) managedFile(t testing.TB) string {
	t.Helper()
	return filepath.Join(e.runnerDir(t), "managed.txt")
}

// runnerDir returns a host directory the test reads and writes, which the
// namespace's runner pods (single-use, each with a root of its own) see at
// the same path once a Stack mounts it (withRunnerDir), the way a Stack
// mounts a claim: a hostPath PersistentVolume the administrator (this test)
// creates, bound to the namespace's claim, which the runner's
// ServiceAccount may get. One per test namespace.
func (e *stackEnv) runnerDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "files")
	// The runner runs as 65532; the directory is the test's.
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pvName := "files-" + e.ns
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Namespace: e.ns, Name: filesClaim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir},
			},
		},
	}
	if err := e.c.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), pv) })
	empty := ""
	e.create(t, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: filesClaim},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: &empty,
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	})
	e.allowRunnerToGet(t, "persistentvolumeclaims", filesClaim)
	eventually(t, time.Minute, "the files claim bound", func() error {
		var pvc corev1.PersistentVolumeClaim
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: filesClaim}, &pvc); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), filesClaim, nil)
		}
		return nil
	})
	return dir
}

// withRunnerDir has s's runner pods mount the runnerDir dir (at the same
// path).
func withRunnerDir(s *terracev1.Stack, dir string) *terracev1.Stack {
	if s.Spec.Runner == nil {
		s.Spec.Runner = &terracev1.RunnerPodTemplate{}
	}
	s.Spec.Runner.Volumes = append(s.Spec.Runner.Volumes, corev1.Volume{Name: "files", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: filesClaim},
	}})
	s.Spec.Runner.VolumeMounts = append(s.Spec.Runner.VolumeMounts, corev1.VolumeMount{Name: "files", MountPath: dir})
	return s
}

// fileStack is a Stack of the files Program managing path (from
// managedFile), whose runner mounts the runnerDir path is in.
func fileStack(name, path string, approve string, mode terracev1.DriftDetectionMode) *terracev1.Stack {
	return withRunnerDir(&terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:         terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "files"}},
			Vars:           map[string]apiextensionsv1.JSON{"path": {Raw: []byte(strconv.Quote(path))}},
			ApprovePlan:    approve,
			Interval:       &metav1.Duration{Duration: 3 * time.Second},
			DriftDetection: &terracev1.DriftDetection{Mode: mode},
			RetryInterval:  &metav1.Duration{Duration: 2 * time.Second},
		},
	}, filepath.Dir(path))
}

// allowRunnerToGet lets the namespace's default ServiceAccount, which
// runner pods run as, get the named objects of resource (of the core
// group): Terrace gives a runner only what its ServiceAccount may read.
func (e *stackEnv) allowRunnerToGet(t testing.TB, resource string, names ...string) {
	t.Helper()
	name := "get-" + resource
	for _, n := range names {
		name += "." + n
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{resource}, Verbs: []string{"get"}, ResourceNames: names},
	}}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: e.ns}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := e.c.Create(context.Background(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("failed to create %T %s: %v", obj, name, err)
		}
	}
}
