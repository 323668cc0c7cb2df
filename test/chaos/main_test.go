// Package chaos injects faults into a dev cluster while Stacks run and
// counts what was lost (issue 16). TestChaosSmoke injects one fault of each
// kind and runs with `go test ./...`; TestChaosLong repeats them at the
// counts of the issue and is built only with the tag chaos (`make chaos`).
// Both print a results table, the one docs/reliability.md copies.
//
// The cluster is the project's own dev cluster (devcluster.StartDev): a
// control plane and a real node (containerd, runc, the kubelet, kube-proxy)
// that runs runner pods from the image built from this checkout, two
// `terrace controller` processes with leader election behind a small TCP
// proxy on the host's end of the node's link that stands in for their
// Service, and PostgreSQL for one namespace. Every fault is real: a signal
// to a process, a restarted server, a deleted pod, a rebooted node, a full
// disk. TERRACE_CHAOS_FAULTS picks faults (selectFaults).
package chaos

import (
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// terraceBinary is built from this checkout in TestMain: the controllers run
// it and the dev image is built from it.
var terraceBinary string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// The harness's own clients log nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	tmp, err := os.MkdirTemp("", "terrace-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	// TERRACE_CHAOS_TERRACE=path reuses a binary built from this checkout.
	if terraceBinary = os.Getenv("TERRACE_CHAOS_TERRACE"); terraceBinary != "" {
		return m.Run()
	}
	if terraceBinary, err = testenv.BuildTerrace(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	return m.Run()
}
