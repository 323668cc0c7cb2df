package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// The images of the Flux test, as test/e2e/testdata/flux names them: the
// dev registry answers for every registry name, so source-controller keeps
// the name Flux publishes it under.
const (
	sourceControllerImage = "ghcr.io/fluxcd/source-controller:v1.9.6"
	gitServerImage        = "ghcr.io/terrace-dev/e2e-gitserver:1"
	// gitRepoURL is the git server's repository, through its Service.
	gitRepoURL = "http://git-server.git.svc.cluster.local/terrace.git"
	// sourceControllerURL is where source-controller serves artifacts
	// (--storage-adv-addr): a host config/default's controller allows.
	sourceControllerURL = "http://source-controller.flux-system.svc.cluster.local./"
)

// requireFluxBin returns the directory `make tools` fills with
// source-controller, its CRDs and the git server, or fails the test with
// what to do.
func requireFluxBin(t *testing.T) string {
	t.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"source-controller", "gitserver", "crds"} {
		if _, err := os.Stat(filepath.Join(tools.FluxBin, f)); err != nil {
			t.Fatalf("%s is missing from %q: run `make tools` (it builds Flux's source-controller from its Go module)", f, tools.FluxBin)
		}
	}
	return tools.FluxBin
}

// applyManifests applies the objects of the YAML files under dir and waits
// until every one is Current (a CRD established, a Deployment available).
func applyManifests(t *testing.T, cfg *rest.Config, dir string, timeout time.Duration) {
	t.Helper()
	// $TERRACE_FLUX_BIN/crds is a link into the tools cache.
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := devcluster.ReadManifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	progress := func(line string) { t.Log(line) }
	if err := devcluster.Apply(ctx, cfg, objs, progress); err != nil {
		t.Fatal(err)
	}
	outcomes, err := devcluster.WaitAll(ctx, cfg, objs, func(string) {})
	if err != nil {
		t.Fatalf("%s did not become Current: %v", dir, err)
	}
	for _, o := range outcomes {
		if o.Health != devcluster.Current {
			t.Fatalf("%s from %s: %s %s", o.Ref(), dir, o.Health, o.Message)
		}
	}
}

// gitRepositoryRevision returns the revision of a GitRepository's
// artifact once source-controller reports it Ready at its generation, and
// checks that the artifact is served by source-controller's Service.
func gitRepositoryRevision(ctx context.Context, c client.Client, ns, name string) (string, error) {
	repo := &unstructured.Unstructured{}
	repo.SetAPIVersion("source.toolkit.fluxcd.io/v1")
	repo.SetKind("GitRepository")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, repo); err != nil {
		return "", err
	}
	ready, why, err := readiness.ReadyAtGeneration(repo)
	if err != nil {
		return "", err
	}
	if !ready {
		return "", fmt.Errorf("GitRepository %s/%s not Ready: %s", ns, name, why)
	}
	revision, _, _ := unstructured.NestedString(repo.Object, "status", "artifact", "revision")
	if revision == "" {
		return "", fmt.Errorf("GitRepository %s/%s is Ready without an artifact", ns, name)
	}
	if url, _, _ := unstructured.NestedString(repo.Object, "status", "artifact", "url"); !strings.HasPrefix(url, sourceControllerURL) {
		return "", fmt.Errorf("GitRepository %s/%s has its artifact at %s, want it under %s", ns, name, url, sourceControllerURL)
	}
	return revision, nil
}

var pushedRevision = regexp.MustCompile(`pushed (\S+@sha1:[0-9a-f]{40})`)

// pushCommit commits files as the whole tree of the git server's main
// branch and pushes it from a pod, through the git server's Service, as a
// developer's git push would; it returns the commit's revision as Flux
// writes it (main@sha1:<hex>).
func pushCommit(t *testing.T, cs kubernetes.Interface, name string, files map[string]string) string {
	t.Helper()
	ctx := context.Background()
	const ns = "git"
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Data: files,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "push", Image: gitServerImage,
				Args: []string{"push", "--url=" + gitRepoURL, "--branch=main", "--from=/files", "--message=" + name},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "files", MountPath: "/files", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "files", VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}},
			}}},
		},
	}
	phase, log := runPodToTheEnd(t, cs, pod, ns, 90*time.Second)
	m := pushedRevision.FindStringSubmatch(log)
	if phase != corev1.PodSucceeded || m == nil {
		t.Fatalf("the push from pod %s/%s ended %s: %s", ns, name, phase, log)
	}
	return m[1]
}

// logPodsOnFailure logs, when the test has failed, each pod of the
// namespaces with its phase and the end of its log; defer it while the
// cluster still runs.
func logPodsOnFailure(t *testing.T, cs kubernetes.Interface, namespaces ...string) {
	if !t.Failed() {
		return
	}
	ctx := context.Background()
	for _, ns := range namespaces {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Logf("pods of %s: %v", ns, err)
			continue
		}
		for _, p := range pods.Items {
			log, err := podLogs(ctx, cs, ns, p.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](30)})
			if err != nil {
				log = err.Error()
			}
			t.Logf("pod %s/%s is %s; its log ends:\n%s", ns, p.Name, p.Status.Phase, log)
		}
	}
}
