package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
)

// clusterRequests reads kube-apiserver's apiserver_request_total: every
// request the cluster served, the controller's, the kubelet's (pod
// status writes, tokens, leases), the scheduler's (bindings) and the control plane's own, by verb and
// resource. Per Stack, it says what a run costs the cluster, beyond the
// controller's own calls.
func clusterRequests(b *testing.B, cs kubernetes.Interface) map[string]float64 {
	b.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("failed to read kube-apiserver's metrics: %v", err)
	}
	served := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		labels, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			served[metricLabel(labels, "verb")+" "+strings.TrimSuffix(metricLabel(labels, "resource")+"/"+metricLabel(labels, "subresource"), "/")] += v
		}
	}
	return served
}

// metricLabel is the value of label name in a sample's labels, as
// `a="x",b="y"} 12` (none of these values holds a quote or a comma).
func metricLabel(labels, name string) string {
	labels, _, _ = strings.Cut(labels, "}")
	for _, pair := range strings.Split(labels, ",") {
		if value, ok := strings.CutPrefix(pair, name+`="`); ok {
			return strings.TrimSuffix(value, `"`)
		}
	}
	return ""
}

// logClusterRequests logs the cluster's requests between two readings per
// Stack, by kind, and returns their total per Stack.
func logClusterRequests(b *testing.B, before, after map[string]float64, n int) float64 {
	var total float64
	var lines []string
	for kind, v := range after {
		d := (v - before[kind]) / float64(n)
		total += d
		if d >= 0.05 {
			lines = append(lines, fmt.Sprintf("%8.2f  %s", d, kind))
		}
	}
	slices.Sort(lines)
	b.Logf("cluster requests per Stack by kind:\n%s", strings.Join(lines, "\n"))
	return total
}
