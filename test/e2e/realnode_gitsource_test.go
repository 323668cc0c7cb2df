package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestGitSourceFollowsABranch: on the real node, with no Flux, a Stack
// with spec.source.git clones the in-cluster git server from its runner
// pod and applies the seed commit; a pushed commit is picked up at the
// Stack's interval (nobody nudges it) and applied as a new release, with
// status.git naming it; a Stack pointing at a tag that does not exist is
// Stalled with SourceRefNotFound naming the tag.
func TestGitSourceFollowsABranch(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	fluxBin := requireFluxBin(t)
	dev := startTerraceDev(t, t.TempDir())
	defer dev.interrupt(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", dev.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	defer logPodsOnFailure(t, cs, "git", "apps")
	ctx := context.Background()
	begin := time.Now()
	if err := devcluster.PushBinaryImage(ctx, dev.registry, gitServerImage, filepath.Join(fluxBin, "gitserver")); err != nil {
		t.Fatal(err)
	}
	applyManifests(t, cfg, filepath.Join(testenv.RepoRoot(), "test", "e2e", "testdata", "flux", "git-server"), 2*time.Minute)
	objs, err := devcluster.ReadManifests(filepath.Join(testenv.RepoRoot(), "test", "e2e", "testdata", "gitsource"))
	if err != nil {
		t.Fatal(err)
	}
	if err := devcluster.Apply(ctx, cfg, objs, func(line string) { t.Log(line) }); err != nil {
		t.Fatal(err)
	}

	var first terracev1.Stack
	eventually(t, 3*time.Minute, "the Stack to apply the seed commit", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "infra"}, &first); err != nil {
			return err
		}
		if first.Status.Git == nil || !strings.HasPrefix(first.Status.Git.Revision, "main@sha1:") {
			return fmt.Errorf("status.git is %+v (%s)", first.Status.Git, conditionsText(&first))
		}
		return nil
	})
	seed := first.Status.Git.Revision
	waitApplied(t, c, seed, "one")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "infra"}, &first); err != nil {
		t.Fatal(err)
	}
	t.Logf("the Stack applied %s (%q by %s) after %s", seed, first.Status.Git.Message, first.Status.Git.Author, time.Since(begin).Round(100*time.Millisecond))

	pushed := time.Now()
	second := pushCommit(t, cs, "release-two", map[string]string{"main.tf": releaseModule("two")})
	if second == seed {
		t.Fatalf("the push left the branch at %s", seed)
	}
	waitApplied(t, c, second, "two")
	var after terracev1.Stack
	if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "infra"}, &after); err != nil {
		t.Fatal(err)
	}
	if after.Status.Git.Revision != second || after.Status.Git.Message != "release-two" {
		t.Fatalf("status.git is %+v, want %s, release-two", after.Status.Git, second)
	}
	if after.Status.Release == nil || first.Status.Release == nil || after.Status.Release.Revision <= first.Status.Release.Revision {
		t.Fatalf("release %+v after the push, %+v before: want a new release", after.Status.Release, first.Status.Release)
	}
	t.Logf("the Stack applied the pushed %s %s after the push", second, time.Since(pushed).Round(100*time.Millisecond))

	eventually(t, 2*time.Minute, "the Stack of a missing tag to stall", func() error {
		var s terracev1.Stack
		if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "missing-tag"}, &s); err != nil {
			return err
		}
		for _, cond := range s.Status.Conditions {
			if cond.Type == terracev1.StalledCondition && cond.Status == "True" && cond.Reason == "SourceRefNotFound" && strings.Contains(cond.Message, `tag "v9.9.9" not found`) {
				return nil
			}
		}
		return fmt.Errorf("conditions: %s", conditionsText(&s))
	})
}
