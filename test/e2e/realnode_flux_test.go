package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestFluxSourceControllerFeedsAStack runs Flux's own source-controller,
// built from its Go module, as a Deployment behind its Service on the real
// node, with Terrace installed from config/default unchanged: a
// GitRepository fetched from a git server in the cluster feeds a Stack,
// which applies the module; a commit pushed to the git server then reaches
// the Stack as a new revision, applied. Nothing leaves the dev cluster.
func TestFluxSourceControllerFeedsAStack(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	fluxBin := requireFluxBin(t)
	dev := startTerraceDev(t, t.TempDir())
	defer dev.interrupt(t)
	if dev.registry == "" {
		t.Fatal("terrace dev printed no registry line")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", dev.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	defer logPodsOnFailure(t, cs, "flux-system", "git", "apps")
	ctx := context.Background()
	begin := time.Now()

	for ref, binary := range map[string]string{
		sourceControllerImage: filepath.Join(fluxBin, "source-controller"),
		gitServerImage:        filepath.Join(fluxBin, "gitserver"),
	} {
		if err := devcluster.PushBinaryImage(ctx, dev.registry, ref, binary); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("images pushed after %s", time.Since(begin).Round(100*time.Millisecond))
	testdata := filepath.Join(testenv.RepoRoot(), "test", "e2e", "testdata", "flux")
	applyManifests(t, cfg, filepath.Join(fluxBin, "crds"), time.Minute)
	applyManifests(t, cfg, filepath.Join(testdata, "source-controller"), 3*time.Minute)
	applyManifests(t, cfg, filepath.Join(testdata, "git-server"), 2*time.Minute)
	t.Logf("source-controller and the git server available after %s", time.Since(begin).Round(100*time.Millisecond))
	var seed corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "git", Name: "seed"}, &seed); err != nil {
		t.Fatal(err)
	}
	if seed.Data["main.tf"] != releaseModule("one") {
		t.Fatalf("the git server's seed is not releaseModule(\"one\"):\n%s", seed.Data["main.tf"])
	}
	objs, err := devcluster.ReadManifests(filepath.Join(testdata, "apps"))
	if err != nil {
		t.Fatal(err)
	}
	if err := devcluster.Apply(ctx, cfg, objs, func(line string) { t.Log(line) }); err != nil {
		t.Fatal(err)
	}

	var first string
	eventually(t, 2*time.Minute, "source-controller's artifact of the seed commit", func() error {
		first, err = gitRepositoryRevision(ctx, c, "apps", "infra")
		return err
	})
	waitApplied(t, c, first, "one")
	t.Logf("the Stack applied %s after %s", first, time.Since(begin).Round(100*time.Millisecond))

	pushed := time.Now()
	second := pushCommit(t, cs, "release-two", map[string]string{"main.tf": releaseModule("two")})
	if second == first {
		t.Fatalf("the push left the branch at %s", first)
	}
	// The GitRepository's interval is 10 s: no one nudges source-controller.
	eventually(t, time.Minute, "source-controller's artifact of the pushed commit", func() error {
		rev, err := gitRepositoryRevision(ctx, c, "apps", "infra")
		if err == nil && rev != second {
			err = fmt.Errorf("the artifact is of %s, want %s", rev, second)
		}
		return err
	})
	waitApplied(t, c, second, "two")
	t.Logf("the Stack applied the pushed %s %s after the push", second, time.Since(pushed).Round(100*time.Millisecond))
}

// releaseModule is the module test/e2e/testdata/flux/git-server seeds the
// repository with, its release input set to release.
func releaseModule(release string) string {
	return fmt.Sprintf(`resource "terraform_data" "release" {
  input = %q
}

output "release" {
  value = terraform_data.release.output
}
`, release)
}

// waitApplied waits until the Stack apps/infra is Ready having applied
// revision, its outputs Secret holding release.
func waitApplied(t *testing.T, c client.Client, revision, release string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 3*time.Minute, fmt.Sprintf("the Stack to apply %s", revision), func() error {
		var s terracev1.Stack
		if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "infra"}, &s); err != nil {
			return err
		}
		if err := readyAt(&s); err != nil {
			return fmt.Errorf("%w (%s)", err, conditionsText(&s))
		}
		if s.Status.LastAppliedRevision != revision {
			return fmt.Errorf("lastAppliedRevision is %q, want %q", s.Status.LastAppliedRevision, revision)
		}
		if !slices.Contains(s.Status.Outputs, "release") {
			return fmt.Errorf("status.outputs is %v, want release among them", s.Status.Outputs)
		}
		var sec corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "infra-outputs"}, &sec); err != nil {
			return err
		}
		if got := string(sec.Data["release"]); got != release {
			return errors.New("output release is " + got + ", want " + release)
		}
		return nil
	})
}
