package devcluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// RebootNode power-cycles the dev cluster's node, as a host that crashed
// and booted again: its namespaces end at once, taking every container
// with them (SIGKILL, no termination grace, nothing reported to the API
// server), and the node comes back under the same name, on the same
// addresses, with the same disk — containerd's images and container
// records, the kubelet's pod directories — but an empty /run, so no
// container survives. The kubelet then finds the pods bound to it and
// restarts or fails their containers by their restart policy. It returns
// once the kubelet has reported the node Ready again. The NetworkPolicy
// enforcer follows the node's new namespaces; exceptions made with Reach
// are lost. The fault tests (test/chaos) use it.
func (d *Dev) RebootNode(ctx context.Context) error {
	n := d.Node
	if n == nil || n.sandbox == nil {
		return fmt.Errorf("the dev cluster has no node")
	}
	if d.stopEnforcer != nil {
		d.stopEnforcer()
		<-d.enforcerDone
		d.stopEnforcer = nil
	}
	// The namespaces first: their end kills the containers, containerd and
	// the kubelet at once, as a power cut does; the nsenter parents follow.
	n.sandbox.stop()
	for _, p := range n.procs {
		p.stop(0)
	}
	n.procs = nil

	booted := time.Now()
	net := n.sandbox.net
	nodeEnd := net.HostIf + "n"
	lock, err := lockSlot(net.Slot)
	if err != nil {
		return fmt.Errorf("failed to take the node's slot again: %w", err)
	}
	if err := runIP("link", "add", net.HostIf, "type", "veth", "peer", "name", nodeEnd); err != nil {
		_ = lock.Close()
		return fmt.Errorf("failed to recreate the node's link (another dev cluster may have taken slot %d): %w", net.Slot, err)
	}
	sb, err := launchSandbox(ctx, n.dir, n.name, net, nodeEnd)
	if err != nil {
		_ = runIP("link", "del", net.HostIf)
		_ = lock.Close()
		return err
	}
	sb.slotLock = lock
	n.sandbox = sb
	startCtx, cancel := context.WithTimeout(ctx, nodeStartTimeout)
	defer cancel()
	if err := n.start(startCtx, d.Cluster, n.opts); err != nil {
		return fmt.Errorf("the node failed to boot again: %w", err)
	}
	d.startEnforcer(n.opts.log)
	// The Node object may still say Ready from before the reboot: wait for
	// the new kubelet's own report.
	return n.waitReadySince(startCtx, d.Cluster, booted)
}

// waitReadySince waits until the kubelet has reported the Node Ready at or
// after since.
func (n *Node) waitReadySince(ctx context.Context, c *Cluster, since time.Time) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	last := "not seen yet"
	for {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
		} else {
			for _, cond := range node.Status.Conditions {
				if cond.Type != corev1.NodeReady {
					continue
				}
				// Heartbeats have a resolution of a second.
				if cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
					return nil
				}
				last = fmt.Sprintf("%s at %s: %s", cond.Status, cond.LastHeartbeatTime.Format(time.RFC3339), cond.Message)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready again after its reboot (last seen: %s): %w", n.name, last, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
