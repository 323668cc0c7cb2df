package netpol

// Compiled policies written as nftables chains and rules.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

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
