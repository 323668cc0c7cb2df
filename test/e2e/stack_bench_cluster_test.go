package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
)

// clusterRequests sums kube-apiserver's apiserver_request_total: every
// request the cluster served, the controller's, devnode's (the node's pod
// status writes, tokens, bindings) and the control plane's own. Per Stack,
// it says what a run costs the cluster, beyond the controller's own calls.
func clusterRequests(b *testing.B, cs kubernetes.Interface) float64 {
	b.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("failed to read kube-apiserver's metrics: %v", err)
	}
	var total float64
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			total += v
		}
	}
	return total
}
