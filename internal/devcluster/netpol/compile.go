package netpol

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Table is the nftables table (family inet) the rules live in.
const Table = "terrace-netpol"

// protocols are the protocols a NetworkPolicyPort may name, in the order
// their rules are written.
var protocols = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}

// Compile returns the nftables ruleset that enforces policies on pods: a
// text for `nft -f` that replaces the table inet terrace-netpol in one
// transaction (it creates the table first, so the delete also works on the
// first load). Namespaces give namespaceSelectors their labels; a namespace
// missing from the list has only its kubernetes.io/metadata.name label.
// The result depends only on its arguments and is the same for the same
// cluster state, whatever the order of the slices.
func Compile(pods []corev1.Pod, namespaces []corev1.Namespace, policies []networkingv1.NetworkPolicy) string {
	c := newCluster(pods, namespaces)
	compiled := make([]*policy, 0, len(policies))
	for i := range policies {
		compiled = append(compiled, c.compilePolicy(&policies[i]))
	}
	slices.SortFunc(compiled, func(a, b *policy) int { return cmp.Compare(a.key, b.key) })

	ingress, egress := newChainSet("ingress"), newChainSet("egress")
	var self []string
	for _, p := range c.pods {
		var in, out []*policy
		for _, pol := range compiled {
			if pol.namespace != p.pod.Namespace || !pol.selector.Matches(labels.Set(p.pod.Labels)) {
				continue
			}
			if pol.isolatesIngress {
				in = append(in, pol)
			}
			if pol.isolatesEgress {
				out = append(out, pol)
			}
		}
		if len(in) > 0 {
			ingress.add(p, c.ingressChain(p, in))
		}
		if len(out) > 0 {
			egress.add(p, c.egressChain(out))
		}
		if len(in) > 0 || len(out) > 0 {
			for _, ip := range p.ips {
				a := numAddr(ip).String()
				self = append(self, a+" . "+a)
			}
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {}\ndelete table inet %s\ntable inet %s {\n", Table, Table, Table)
	b.WriteString("\tchain forward {\n")
	b.WriteString("\t\ttype filter hook forward priority filter; policy accept;\n")
	b.WriteString("\t\tct state established,related accept\n")
	if len(self) > 0 {
		// A pod reaching itself through a Service comes back through the
		// bridge; Kubernetes lets a pod always reach itself.
		fmt.Fprintf(&b, "\t\tip saddr . ip daddr { %s } accept\n", strings.Join(self, ", "))
	}
	// The ingress chains return when they allow, so that the egress check
	// of the source follows; the egress chains accept.
	ingress.writeDispatch(&b, "daddr")
	egress.writeDispatch(&b, "saddr")
	b.WriteString("\t}\n")
	ingress.writeChains(&b)
	egress.writeChains(&b)
	b.WriteString("}\n")
	return b.String()
}

// policy is a NetworkPolicy with its selectors and peers resolved.
type policy struct {
	key, namespace  string
	comment         string
	selector        labels.Selector
	isolatesIngress bool
	isolatesEgress  bool
	ingress, egress []*rule
}

// rule is one ingress or egress rule: traffic from (to) an address of
// peers, or any address when anyPeer, on one of ports, or any port when
// there are none.
type rule struct {
	anyPeer bool
	peers   spans
	ports   []networkingv1.NetworkPolicyPort
	groups  map[corev1.Protocol]*protocolPorts
	// lines caches the rule's text by the numbers its port names resolve
	// to on a target pod: replicas share it.
	lines map[string][]string
}

func (c *cluster) compilePolicy(np *networkingv1.NetworkPolicy) *policy {
	p := &policy{
		key:       np.Namespace + "/" + np.Name,
		namespace: np.Namespace,
		selector:  selector(&np.Spec.PodSelector),
	}
	p.comment = p.key
	if len(p.comment) > 127 {
		// nftables keeps at most 128 bytes of a comment.
		p.comment = p.comment[:127]
	}
	p.isolatesIngress, p.isolatesEgress = policyTypes(np)
	if p.isolatesIngress {
		for _, r := range np.Spec.Ingress {
			p.ingress = append(p.ingress, c.compileRule(np.Namespace, r.From, r.Ports))
		}
	}
	if p.isolatesEgress {
		for _, r := range np.Spec.Egress {
			p.egress = append(p.egress, c.compileRule(np.Namespace, r.To, r.Ports))
		}
	}
	return p
}

// policyTypes are the directions np isolates the pods it selects in,
// defaulted as the API server does when the policy names none.
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// selector converts a label selector; one that does not convert (the API
// server refuses it) selects nothing.
func selector(s *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

func (c *cluster) compileRule(ns string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) *rule {
	r := &rule{ports: ports, groups: groupPorts(ports), lines: map[string][]string{}}
	if len(peers) == 0 {
		r.anyPeer = true
		return r
	}
	var raw []span
	for _, peer := range peers {
		switch {
		case peer.IPBlock != nil:
			p, ok := parseIPv4Prefix(peer.IPBlock.CIDR)
			if !ok {
				continue
			}
			block := spans{prefixSpan(p)}
			for _, e := range peer.IPBlock.Except {
				if ep, ok := parseIPv4Prefix(e); ok {
					block = block.minus(prefixSpan(ep))
				}
			}
			raw = append(raw, block...)
		case peer.PodSelector != nil || peer.NamespaceSelector != nil:
			for _, p := range c.selectPeers(ns, peer) {
				for _, ip := range p.ips {
					raw = append(raw, span{ip, ip})
				}
			}
		}
	}
	r.peers = normalize(raw)
	return r
}

// selectPeers lists the pods a peer's selectors choose: by podSelector in
// the policy's namespace, by namespaceSelector in the namespaces it
// matches, or by both.
func (c *cluster) selectPeers(ns string, peer networkingv1.NetworkPolicyPeer) []*podInfo {
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		podSel = selector(peer.PodSelector)
	}
	var nsSel labels.Selector
	if peer.NamespaceSelector != nil {
		nsSel = selector(peer.NamespaceSelector)
	}
	var out []*podInfo
	for _, p := range c.pods {
		if nsSel == nil && p.pod.Namespace != ns {
			continue
		}
		if nsSel != nil && !nsSel.Matches(c.namespaceLabels(p.pod.Namespace)) {
			continue
		}
		if podSel.Matches(labels.Set(p.pod.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

// protocolPorts are a rule's ports of one protocol.
type protocolPorts struct {
	any     bool
	numbers []span
	names   []string
}

func groupPorts(ports []networkingv1.NetworkPolicyPort) map[corev1.Protocol]*protocolPorts {
	out := map[corev1.Protocol]*protocolPorts{}
	for _, port := range ports {
		proto := corev1.ProtocolTCP
		if port.Protocol != nil {
			proto = *port.Protocol
		}
		if !slices.Contains(protocols, proto) {
			continue
		}
		g := out[proto]
		if g == nil {
			g = &protocolPorts{}
			out[proto] = g
		}
		switch {
		case port.Port == nil:
			g.any = true
		case port.Port.Type == intstr.String:
			g.names = append(g.names, port.Port.StrVal)
		case port.Port.IntVal > 0:
			lo := uint32(port.Port.IntVal)
			hi := lo
			if port.EndPort != nil && uint32(*port.EndPort) > lo {
				hi = uint32(*port.EndPort)
			}
			g.numbers = append(g.numbers, span{lo, hi})
		}
	}
	return out
}
