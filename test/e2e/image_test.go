package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/terrace-dev/terrace/internal/devcluster"
)

// TestPodRunsFromThePulledImage: a terrace-image pod runs the binary of the
// image the dev cluster pushed, from the container's own root, with the
// image's PATH and working directory, and reports the image's digest.
func TestPodRunsFromThePulledImage(t *testing.T) {
	dev := sharedDev(t)
	if dev.Registry == nil {
		t.Fatal("the dev cluster runs without its registry")
	}
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	ns := testNamespace(t, cs)
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "from-image"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: terraceImage,
			Args: []string{"dev", "pod-fixture", "--listen=$(POD_IP):8080"},
			Env:  []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
		}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, cs, ns, pod.Name, 2*time.Minute, "Running", func(p *corev1.Pod) error {
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s, statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return nil
	})
	st := running.Status.ContainerStatuses[0]

	ref, err := name.ParseReference(dev.Image)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ghcr.io/terrace-dev/terrace@" + desc.Digest.String(); st.ImageID != want {
		t.Errorf("imageID %s, want %s (the pushed image)", st.ImageID, want)
	}

	// The process is the image's terrace under the container's root, not
	// the binary the test built.
	var pid int
	if _, err := fmt.Sscanf(st.ContainerID, "devnode://%d", &pid); err != nil {
		t.Fatalf("container id %q: %v", st.ContainerID, err)
	}
	exe, err := os.Readlink(filepath.Join("/proc", fmt.Sprint(pid), "exe"))
	if err != nil {
		t.Fatal(err)
	}
	var root string
	eventually(t, 30*time.Second, "the pod's server", func() error {
		root, err = httpGet(running.Status.PodIP+":8080", "/env/TERRACE_POD_ROOT")
		return err
	})
	// Hard-linked into the root, or linked to the image cache when that is
	// on another file system: the image's file either way.
	inRoot := exe == filepath.Join(root, "usr/local/bin/terrace")
	inCache := strings.HasPrefix(exe, devcluster.ImageCacheDir()+"/") && strings.HasSuffix(exe, "/rootfs/usr/local/bin/terrace")
	if !inRoot && !inCache || exe == terraceBinary {
		t.Errorf("the process runs %s, want the image's /usr/local/bin/terrace (under %s or the image cache)", exe, root)
	}
	path, err := httpGet(running.Status.PodIP+":8080", "/env/PATH")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(path, filepath.Join(root, "usr/local/bin")+":") {
		t.Errorf("PATH %q, want the image's PATH inside the container's root", path)
	}
	if info, err := os.Stat(filepath.Join(root, "usr/local/bin/tofu")); err != nil || info.Mode().Perm()&0o111 == 0 {
		t.Errorf("the image's tofu is not in the container: %v", err)
	}
}
