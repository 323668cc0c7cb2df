package netpol

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
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

func nftProtocol(p corev1.Protocol) string { return strings.ToLower(string(p)) }

// ingressChain is the rules of a pod's ingress chain: a rule per allowed
// kind of traffic, each returning to the forward chain so that the
// source's egress is checked next, then a drop. Named ports are resolved
// against the pod itself.
func (c *cluster) ingressChain(p *podInfo, policies []*policy) []string {
	var lines []string
	for _, pol := range policies {
		for _, r := range pol.ingress {
			lines = append(lines, c.ruleLines(r, "saddr", "return", pol.comment, p)...)
		}
	}
	return append(lines, "counter drop")
}

// egressChain is the rules of a pod's egress chain: a rule per allowed
// kind of traffic, each accepting, then a drop. Named ports are resolved
// against each destination pod.
func (c *cluster) egressChain(policies []*policy) []string {
	var lines []string
	for _, pol := range policies {
		for _, r := range pol.egress {
			lines = append(lines, c.ruleLines(r, "daddr", "accept", pol.comment, nil)...)
		}
	}
	return append(lines, "counter drop")
}

// ruleLines writes one policy rule: the peer's address is field, and
// verdict is what a match does. Named ports are resolved against target,
// or, when there is none (egress), against every pod the peers contain,
// as pairs of address and port.
func (c *cluster) ruleLines(r *rule, field, verdict, comment string, target *podInfo) []string {
	key := r.namedPortsKey(target)
	if lines, ok := r.lines[key]; ok {
		return lines
	}
	lines := c.writeRule(r, field, verdict, comment, target)
	r.lines[key] = lines
	return lines
}

// namedPortsKey is what r's text depends on in target: the numbers its
// port names resolve to.
func (r *rule) namedPortsKey(target *podInfo) string {
	if target == nil {
		return ""
	}
	var b strings.Builder
	for _, proto := range protocols {
		if g := r.groups[proto]; g != nil {
			for _, name := range g.names {
				n, ok := target.namedPort(name, proto)
				fmt.Fprintf(&b, "%d:%t,", n, ok)
			}
		}
	}
	return b.String()
}

func (c *cluster) writeRule(r *rule, field, verdict, comment string, target *podInfo) []string {
	match := ""
	if !r.anyPeer {
		if len(r.peers) == 0 {
			return nil
		}
		match = "ip " + field + " " + set(r.peers.addrElements()) + " "
	}
	tail := fmt.Sprintf("%s comment %q", verdict, comment)
	if len(r.ports) == 0 {
		return []string{match + tail}
	}
	var lines []string
	for _, proto := range protocols {
		g := r.groups[proto]
		if g == nil {
			continue
		}
		l4 := "meta l4proto " + nftProtocol(proto) + " "
		if g.any {
			lines = append(lines, match+l4+tail)
			continue
		}
		numbers := slices.Clone(g.numbers)
		var pairs []string
		if target != nil {
			for _, name := range g.names {
				if n, ok := target.namedPort(name, proto); ok {
					numbers = append(numbers, span{n, n})
				}
			}
		} else {
			pairs = c.namedDestinations(r, proto, g.names)
		}
		if len(numbers) > 0 {
			lines = append(lines, match+l4+"th dport "+set(normalize(numbers).portElements())+" "+tail)
		}
		if len(pairs) > 0 {
			lines = append(lines, l4+"ip daddr . th dport { "+strings.Join(pairs, ", ")+" } "+tail)
		}
	}
	return lines
}

// namedDestinations resolves port names against every pod a rule's peers
// contain, as "address . port" elements.
func (c *cluster) namedDestinations(r *rule, proto corev1.Protocol, names []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range c.pods {
		for _, ip := range p.ips {
			if !r.anyPeer && !r.peers.contains(ip) {
				continue
			}
			for _, name := range names {
				n, ok := p.namedPort(name, proto)
				if !ok {
					continue
				}
				e := fmt.Sprintf("%s . %d", numAddr(ip), n)
				if !seen[e] {
					seen[e] = true
					out = append(out, e)
				}
			}
		}
	}
	return out
}

// chainSet names the pods' chains of one direction; pods whose rules are
// the same share a chain.
type chainSet struct {
	prefix   string
	byBody   map[string]string
	bodies   [][]string
	dispatch []dispatch
}

type dispatch struct {
	ip    uint32
	chain string
}

func newChainSet(prefix string) *chainSet {
	return &chainSet{prefix: prefix, byBody: map[string]string{}}
}

func (s *chainSet) add(p *podInfo, body []string) {
	key := strings.Join(body, "\n")
	name, ok := s.byBody[key]
	if !ok {
		name = fmt.Sprintf("%s-%d", s.prefix, len(s.bodies))
		s.byBody[key] = name
		s.bodies = append(s.bodies, body)
	}
	for _, ip := range p.ips {
		s.dispatch = append(s.dispatch, dispatch{ip, name})
	}
}

func (s *chainSet) writeDispatch(b *strings.Builder, field string) {
	if len(s.dispatch) == 0 {
		return
	}
	slices.SortFunc(s.dispatch, func(a, b dispatch) int { return cmp.Compare(a.ip, b.ip) })
	elems := make([]string, len(s.dispatch))
	for i, d := range s.dispatch {
		elems[i] = numAddr(d.ip).String() + " : jump " + d.chain
	}
	fmt.Fprintf(b, "\t\tip %s vmap { %s }\n", field, strings.Join(elems, ", "))
}

func (s *chainSet) writeChains(b *strings.Builder) {
	for i, body := range s.bodies {
		fmt.Fprintf(b, "\tchain %s-%d {\n", s.prefix, i)
		for _, line := range body {
			b.WriteString("\t\t" + line + "\n")
		}
		b.WriteString("\t}\n")
	}
}
