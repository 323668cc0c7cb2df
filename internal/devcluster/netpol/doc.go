// Package netpol enforces Kubernetes NetworkPolicies on the dev cluster's
// node by compiling them to one nftables table, `table inet terrace-netpol`.
//
// It exists because sigs.k8s.io/kube-network-policies queues packets to
// user space with nftables' queue expression, which needs CONFIG_NFT_QUEUE;
// the kernels Terrace's dev cluster runs on may lack it. Here every decision
// is made by the kernel from sets and verdict maps, and nothing is queued.
//
// How it works: an Enforcer watches Pods, Namespaces and NetworkPolicies,
// and after each burst of changes Compile turns the whole cluster state into
// the table's text, which the caller loads with `nft -f -` in the node's
// network namespace. The text deletes and recreates the table in one
// transaction, so a load is atomic and connection tracking entries survive
// it. The table has one base chain on the forward hook (pod-to-pod traffic
// on the bridge passes it through br_netfilter, after kube-proxy's DNAT):
// established and related packets are accepted first, then the destination
// address picks the destination pod's ingress chain from a verdict map and
// the source address the source pod's egress chain. Pods whose rules come
// out the same share one chain, so a Deployment's hundred replicas cost one
// chain and a hundred map elements. An accept in this table ends only its
// own chain: drops of other tables on the hook (the dev cluster's hermetic
// rule, kube-proxy's) still apply.
//
// Supported, with the semantics of networking.k8s.io/v1:
//   - ingress and egress, with policyTypes defaulted as the API server does
//     (Ingress always, Egress when the policy has egress rules);
//   - a pod selected by no policy of a direction is not isolated in it; the
//     rules of all policies that select a pod are a union;
//   - peers by podSelector (in the policy's namespace), namespaceSelector,
//     both combined, and ipBlock with except; an empty from/to, or a rule
//     with no peers, allows every address;
//   - ports with protocol TCP, UDP or SCTP (TCP when unset), a number, a
//     number with endPort, or a name, resolved per destination pod against
//     its containers' (and init containers') ports of that protocol, so two
//     pods may give one name different numbers; a port with no number
//     allows every port of its protocol; a rule with ports allows no other
//     protocol (ICMP only through rules without ports).
//
// Only pods with an IPv4 address that are not hostNetwork and have not
// finished count, as peers and as targets. When two such pods claim one
// address (a stale status), the newer one owns it.
//
// Limits and choices:
//   - IPv6: IPv6 addresses and ipBlocks are ignored and IPv6 traffic passes
//     unfiltered (the dev cluster is IPv4 only);
//   - traffic from the node itself (the kubelet's probes, host processes,
//     hostNetwork pods) reaches pods through the output path, which is not
//     hooked, so it is always allowed, as Kubernetes requires; traffic from
//     pods to the node's own addresses takes the input path and is not
//     filtered either;
//   - a pod always reaches itself, also through a Service (hairpin);
//   - connections established before a policy denied them go on until they
//     end, as with most implementations;
//   - ipBlock peers match any address, pods' included, as in most
//     implementations; traffic from outside the node (the host's end of
//     the dev cluster's link) is matched by its own source address.
package netpol
