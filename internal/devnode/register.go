package devnode

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The Node object: labels, registration, status and the heartbeat Lease.

func (n *Node) labels() map[string]string {
	return map[string]string{
		corev1.LabelHostname:   n.opts.NodeName,
		corev1.LabelOSStable:   runtime.GOOS,
		corev1.LabelArchStable: runtime.GOARCH,
		"terrace.dev/devnode":  "true",
	}
}

// register creates or refreshes the Node, clears the taints the API
// server's admission adds to new nodes, and reports it Ready.
func (n *Node) register(ctx context.Context) error {
	nodes := n.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, n.opts.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.opts.NodeName, Labels: n.labels()}}, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("failed to register node %s: %w", n.opts.NodeName, err)
	}
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	for k, v := range n.labels() {
		node.Labels[k] = v
	}
	var taints []corev1.Taint
	for _, t := range node.Spec.Taints {
		if !strings.HasPrefix(t.Key, "node.kubernetes.io/") {
			taints = append(taints, t)
		}
	}
	node.Spec.Taints = taints
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("failed to update node %s: %w", n.opts.NodeName, err)
	}
	return n.updateNodeStatus(ctx, node)
}

func (n *Node) updateNodeStatus(ctx context.Context, node *corev1.Node) error {
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    nodeCPU,
		corev1.ResourceMemory: nodeMemory,
		corev1.ResourcePods:   resource.MustParse("250"),
	}
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: hostIP}, {Type: corev1.NodeHostName, Address: n.opts.NodeName}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(n.logPort)
	node.Status.NodeInfo = corev1.NodeSystemInfo{
		OperatingSystem:         runtime.GOOS,
		Architecture:            runtime.GOARCH,
		KubeletVersion:          "devnode",
		ContainerRuntimeVersion: "devnode://terrace",
	}
	conds := []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "devnode is posting ready status"},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure"},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID"},
	}
	for i := range conds {
		conds[i].LastHeartbeatTime, conds[i].LastTransitionTime = now, now
		for _, old := range node.Status.Conditions {
			if old.Type == conds[i].Type && old.Status == conds[i].Status {
				conds[i].LastTransitionTime = old.LastTransitionTime
			}
		}
	}
	node.Status.Conditions = conds
	if _, err := n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("failed to report node status: %w", err)
	}
	return nil
}

// heartbeat renews the node Lease every 10 s and the Ready condition every
// minute, as the kubelet does.
func (n *Node) heartbeat(ctx context.Context) {
	ticker := time.NewTicker(10 * time.Second)
	defer ticker.Stop()
	lastStatus := time.Now()
	for {
		if err := n.renewLease(ctx); err != nil && ctx.Err() == nil {
			n.log.Info("failed to renew node lease", "error", err.Error())
		}
		if time.Since(lastStatus) >= time.Minute {
			node, err := n.client.CoreV1().Nodes().Get(ctx, n.opts.NodeName, metav1.GetOptions{})
			if err == nil {
				err = n.updateNodeStatus(ctx, node)
			}
			if err != nil && ctx.Err() == nil {
				n.log.Info("failed to report node status", "error", err.Error())
			}
			lastStatus = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (n *Node) renewLease(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, n.opts.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.opts.NodeName},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(n.opts.NodeName),
				LeaseDurationSeconds: ptr.To(int32(40)),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}
