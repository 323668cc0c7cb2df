package netpol

// The cluster as NetworkPolicy sees it: pods with their addresses and
// labels, and namespaces' labels.

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// podInfo is a pod that counts for NetworkPolicy, with the IPv4 addresses
// it owns.
type podInfo struct {
	pod *corev1.Pod
	ips []uint32
}

// cluster is what Compile reads: the pods that count and the namespaces'
// labels.
type cluster struct {
	pods     []*podInfo
	nsLabels map[string]labels.Set
}

func newCluster(pods []corev1.Pod, namespaces []corev1.Namespace) *cluster {
	c := &cluster{nsLabels: make(map[string]labels.Set, len(namespaces))}
	for i := range namespaces {
		ns := &namespaces[i]
		set := make(labels.Set, len(ns.Labels)+1)
		maps.Copy(set, ns.Labels)
		set[corev1.LabelMetadataName] = ns.Name
		c.nsLabels[ns.Name] = set
	}
	owner := map[uint32]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ip := range podIPv4s(p) {
			if cur, ok := owner[ip]; !ok || newerPod(p, cur) {
				owner[ip] = p
			}
		}
	}
	infos := map[*corev1.Pod]*podInfo{}
	for ip, p := range owner {
		info := infos[p]
		if info == nil {
			info = &podInfo{pod: p}
			infos[p] = info
			c.pods = append(c.pods, info)
		}
		info.ips = append(info.ips, ip)
	}
	for _, info := range c.pods {
		slices.Sort(info.ips)
	}
	slices.SortFunc(c.pods, func(a, b *podInfo) int { return cmp.Compare(podKey(a.pod), podKey(b.pod)) })
	return c
}

func podKey(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// newerPod decides which of two pods claiming one address owns it: the
// younger, as the address was given to it last.
func newerPod(p, than *corev1.Pod) bool {
	if !p.CreationTimestamp.Equal(&than.CreationTimestamp) {
		return than.CreationTimestamp.Before(&p.CreationTimestamp)
	}
	return podKey(p) < podKey(than)
}

func podIPv4s(p *corev1.Pod) []uint32 {
	var raw []string
	for _, ip := range p.Status.PodIPs {
		raw = append(raw, ip.IP)
	}
	if len(raw) == 0 && p.Status.PodIP != "" {
		raw = append(raw, p.Status.PodIP)
	}
	var out []uint32
	for _, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if a = a.Unmap(); a.Is4() && !slices.Contains(out, addrNum(a)) {
			out = append(out, addrNum(a))
		}
	}
	return out
}

// namespaceLabels are the labels a namespaceSelector sees on ns.
func (c *cluster) namespaceLabels(ns string) labels.Set {
	if set, ok := c.nsLabels[ns]; ok {
		return set
	}
	return labels.Set{corev1.LabelMetadataName: ns}
}

// namedPort resolves a port name against the pod's containers.
func (p *podInfo) namedPort(name string, proto corev1.Protocol) (uint32, bool) {
	for _, list := range [][]corev1.Container{p.pod.Spec.Containers, p.pod.Spec.InitContainers} {
		for _, ctr := range list {
			for _, port := range ctr.Ports {
				if port.Name == name && cmp.Or(port.Protocol, corev1.ProtocolTCP) == proto {
					return uint32(port.ContainerPort), true
				}
			}
		}
	}
	return 0, false
}
