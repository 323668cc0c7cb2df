package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// BenchmarkTerraceDevStartup measures `terrace dev` from start to a printed
// KUBECONFIG (control plane, CRDs, controller and devnode ready) against the
// bare control plane (etcd, kube-apiserver, kube-controller-manager and the
// CRDs, devcluster.Start) started in the same run: the ratio is what
// Terrace adds on top of the API server it cannot do without.
//
//	go test ./test/e2e/ -run '^$' -bench TerraceDevStartup -benchtime 3x
func BenchmarkTerraceDevStartup(b *testing.B) {
	tools, err := testenv.FindTools()
	if err != nil {
		b.Fatal(err)
	}
	crds := testenv.RepoRoot() + "/config/crd/bases"
	var dev, bare time.Duration
	runs := 0
	for b.Loop() {
		runs++
		p := startTerraceDev(b, b.TempDir())
		dev += p.startup
		p.interrupt(b)

		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), devcluster.StartupTimeout)
		c, err := devcluster.Start(ctx, devcluster.Options{BinDir: tools.KubebuilderAssets, Dir: b.TempDir(), CRDDirs: []string{crds}})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		bare += time.Since(begin)
		if err := c.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(runs)
	b.ReportMetric(dev.Seconds()/n, "dev-s")
	b.ReportMetric(bare.Seconds()/n, "control-plane-s")
	b.ReportMetric(dev.Seconds()/bare.Seconds(), "dev/control-plane")
}
