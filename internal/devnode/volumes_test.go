package devnode

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

func TestPathMapperRewrite(t *testing.T) {
	m := newPathMapper("/r", []corev1.VolumeMount{
		{MountPath: "/etc/tls"}, {MountPath: "/etc/tls/ca/"}, {MountPath: "/work"}, {MountPath: "/"},
	})
	for in, want := range map[string]string{
		"/etc/tls":           "/r/etc/tls",
		"/etc/tls/tls.crt":   "/r/etc/tls/tls.crt",
		"/etc/tls/ca/ca.crt": "/r/etc/tls/ca/ca.crt",
		"--tls-dir=/etc/tls": "--tls-dir=/r/etc/tls",
		"/etc/tlsx":          "/etc/tlsx",
		"/etc":               "/etc",
		"a:/work:/etc/tls":   "a:/r/work:/r/etc/tls",
		"/work,/etc/tls/x":   "/r/work,/r/etc/tls/x",
		"https://host/work":  "https://host/work",
		"relative/etc/tls":   "relative/etc/tls",
		"--flag=/var/run/x":  "--flag=/var/run/x",
		"--x=/work=1":        "--x=/r/work=1",
	} {
		if got := m.rewrite(in); got != want {
			t.Errorf("rewrite(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestVolumeWriterMaterialisesAndUpdates(t *testing.T) {
	client := testObjects()
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds", DefaultMode: ptr.To[int32](0o400)}}},
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "settings"},
			Items:                []corev1.KeyToPath{{Key: "level", Path: "nested/level.txt", Mode: ptr.To[int32](0o640)}},
		}}},
		{Name: "info", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Items: []corev1.KeyToPath{{Key: "region", Path: "region"}}}},
		}}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	dir := t.TempDir()
	w := newVolumeWriter(client, pod, "127.0.0.9", dir)
	ctx := context.Background()
	if err := w.writeAll(ctx); err != nil {
		t.Fatal(err)
	}
	expectFile(t, filepath.Join(dir, "tls", "password"), "s3cret", 0o400)
	expectFile(t, filepath.Join(dir, "tls", "user"), "admin", 0o400)
	expectFile(t, filepath.Join(dir, "cfg", "nested", "level.txt"), "debug", 0o640)
	expectFile(t, filepath.Join(dir, "info", "namespace"), "ns", 0o644)
	expectFile(t, filepath.Join(dir, "info", "region"), "eu", 0o644)
	if info, err := os.Stat(filepath.Join(dir, "scratch")); err != nil || !info.IsDir() {
		t.Fatalf("emptyDir missing: %v", err)
	}

	// A key removed from the Secret disappears, a changed one is replaced.
	sec, _ := client.CoreV1().Secrets("ns").Get(ctx, "creds", metav1.GetOptions{})
	sec.Data = map[string][]byte{"password": []byte("rotated")}
	if _, err := client.CoreV1().Secrets("ns").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.writeAll(ctx); err != nil {
		t.Fatal(err)
	}
	expectFile(t, filepath.Join(dir, "tls", "password"), "rotated", 0o400)
	if _, err := os.Stat(filepath.Join(dir, "tls", "user")); !os.IsNotExist(err) {
		t.Fatalf("a removed key is still on disk: %v", err)
	}
}

func TestVolumeWriterMissingSecretIsRetriable(t *testing.T) {
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "later"}}}}
	err := newVolumeWriter(testObjects(), pod, "127.0.0.9", t.TempDir()).writeAll(context.Background())
	var cfgErr *configError
	if !errors.As(err, &cfgErr) {
		t.Fatalf("want a configError, got %v", err)
	}
}

func TestValidateVolumesRefusesHostPath(t *testing.T) {
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	var u *unsupportedError
	if err := validateVolumes(pod); !errors.As(err, &u) || u.reason != ReasonUnsupportedVolume {
		t.Fatalf("want UnsupportedVolume, got %v", err)
	}
}

func TestContainerRootLinksMountsAndSubPaths(t *testing.T) {
	volumes := t.TempDir()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(volumes, "data", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(volumes, "data", "sub", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	mounts := []corev1.VolumeMount{
		{Name: "data", MountPath: "/mnt/all"},
		{Name: "data", MountPath: "/mnt/sub", SubPath: "sub"},
		{Name: "data", MountPath: "/mnt/pod", SubPathExpr: "$(POD)"},
	}
	lookup := func(k string) (string, bool) { return "p1", k == "POD" }
	if err := containerRoot(root, mounts, volumes, lookup); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"mnt/all/sub/f", "mnt/sub/f"} {
		if data, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(data) != "x" {
			t.Errorf("%s: %q, %v", p, data, err)
		}
	}
	if info, err := os.Stat(filepath.Join(volumes, "data", "p1")); err != nil || !info.IsDir() {
		t.Errorf("subPathExpr directory not created: %v", err)
	}
	escape := []corev1.VolumeMount{{Name: "data", MountPath: "/x", SubPath: "../../etc"}}
	var u *unsupportedError
	if err := containerRoot(root, escape, volumes, lookup); !errors.As(err, &u) {
		t.Fatalf("a subPath leaving the volume was accepted: %v", err)
	}
}

func expectFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != content {
		t.Errorf("%s = %q, want %q", path, data, content)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != mode {
		t.Errorf("%s mode %o, want %o", path, info.Mode().Perm(), mode)
	}
}

// TestVolumeObjectsAreReadTogether: the Secret and the ConfigMap of a pod's
// volumes are read concurrently. The API server here answers the Secret
// only once the ConfigMap was asked for, so reading them one after the
// other fails.
func TestVolumeObjectsAreReadTogether(t *testing.T) {
	configMapAsked := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	gets := 0
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/namespaces/ns/configmaps/settings":
			once.Do(func() { close(configMapAsked) })
			_ = json.NewEncoder(w).Encode(&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "ns"}, Data: map[string]string{"level": "debug"}})
		case "/api/v1/namespaces/ns/secrets/creds":
			select {
			case <-configMapAsked:
			case <-time.After(20 * time.Second):
				http.Error(w, "the ConfigMap was not asked for while the Secret was being read", http.StatusServiceUnavailable)
				return
			}
			_ = json.NewEncoder(w).Encode(&corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "ns"}, Data: map[string][]byte{"password": []byte("s3cret")}})
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
	}
	dir := t.TempDir()
	if err := newVolumeWriter(client, pod, "127.0.0.9", dir).writeAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	expectFile(t, filepath.Join(dir, "tls", "password"), "s3cret", 0o644)
	expectFile(t, filepath.Join(dir, "cfg", "level"), "debug", 0o644)
	mu.Lock()
	defer mu.Unlock()
	if gets != 2 {
		t.Errorf("%d reads, want one per object", gets)
	}
}
