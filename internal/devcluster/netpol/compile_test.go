package netpol

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func testPod(ns, name, ip string, labels map[string]string, ports ...corev1.ContainerPort) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Ports: ports}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func testNamespace(name string, labels map[string]string) corev1.Namespace {
	return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func testPolicy(ns, name string, spec networkingv1.NetworkPolicySpec) networkingv1.NetworkPolicy {
	return networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

// sel is a label selector from key, value pairs; sel() selects everything.
func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func port(proto corev1.Protocol, p any) networkingv1.NetworkPolicyPort {
	np := networkingv1.NetworkPolicyPort{Protocol: &proto}
	switch v := p.(type) {
	case int:
		np.Port = new(intstr.FromInt32(int32(v)))
	case string:
		np.Port = new(intstr.FromString(v))
	}
	return np
}

func portRange(proto corev1.Protocol, from, to int32) networkingv1.NetworkPolicyPort {
	np := port(proto, int(from))
	np.EndPort = &to
	return np
}

func containerPort(name string, n int32, proto corev1.Protocol) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: proto}
}

const tcp, udp, sctp = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP

var (
	allowIngress = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	allowEgress  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
)

// testPods is the cluster every case runs on.
func testPods() []corev1.Pod {
	hostNet := testPod("app", "hostnet", "10.0.9.1", map[string]string{"app": "client"})
	hostNet.Spec.HostNetwork = true
	done := testPod("app", "done", "10.0.0.30", map[string]string{"app": "client"})
	done.Status.Phase = corev1.PodSucceeded
	// A stale pod claims the address of a newer one.
	stale := testPod("app", "stale", "10.0.0.21", map[string]string{"app": "client"})
	stranger := testPod("app", "stranger", "10.0.0.21", map[string]string{"app": "stranger"})
	stranger.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	stale.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	return []corev1.Pod{
		testPod("app", "server", "10.0.0.10", map[string]string{"app": "server"},
			containerPort("http", 8080, tcp), containerPort("dns", 53, udp), containerPort("assoc", 7000, sctp)),
		testPod("app", "server2", "10.0.0.11", map[string]string{"app": "server"},
			containerPort("http", 9090, tcp)),
		testPod("app", "client", "10.0.0.20", map[string]string{"app": "client"}),
		stranger, stale, hostNet, done,
		testPod("app", "pending", "", map[string]string{"app": "client"}),
		testPod("other", "client", "10.0.1.20", map[string]string{"app": "client"}),
		testPod("other", "stranger", "10.0.1.21", nil),
		testPod("other", "web", "10.0.1.30", map[string]string{"app": "web"}, containerPort("http", 80, tcp)),
		testPod("unlisted", "client", "10.0.2.20", map[string]string{"app": "client"}),
	}
}

func testNamespaces() []corev1.Namespace {
	return []corev1.Namespace{
		testNamespace("app", map[string]string{"team": "a"}),
		testNamespace("other", map[string]string{"team": "b"}),
	}
}

// conn is a connection a case expects to be allowed or denied. From and to
// are pods ("ns/name") or addresses.
type conn struct {
	from, to string
	proto    corev1.Protocol
	port     uint32
	want     bool
}

func tcpTo(from, to string, port uint32, want bool) conn {
	return conn{from: from, to: to, proto: tcp, port: port, want: want}
}

type compileCase struct {
	name     string
	policies []networkingv1.NetworkPolicy
	conns    []conn
}

var compileCases = []compileCase{
	{
		name: "no policy isolates nothing",
		conns: []conn{
			tcpTo("other/stranger", "app/server", 1, true),
			tcpTo("192.168.1.1", "app/client", 443, true),
			tcpTo("app/server", "192.168.1.1", 443, true),
			{from: "app/client", to: "app/server", proto: "icmp", want: true},
		},
	},
	{
		name: "default deny ingress isolates only its namespace and only ingress",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "deny", networkingv1.NetworkPolicySpec{
			PodSelector: *sel(), PolicyTypes: allowIngress,
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, false),
			tcpTo("other/client", "app/server", 8080, false),
			{from: "app/client", to: "app/server", proto: "icmp", want: false},
			tcpTo("app/server", "other/web", 80, true),
			tcpTo("app/server", "192.168.1.1", 443, true),
			tcpTo("app/client", "other/web", 80, true),
			// A pod reaches itself through a Service (hairpin).
			tcpTo("app/server", "app/server", 8080, true),
		},
	},
	{
		name: "podSelector peer is the policy's namespace only",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "from-clients", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, true),
			tcpTo("app/client", "app/server2", 12345, true),
			tcpTo("other/client", "app/server", 8080, false),
			tcpTo("app/stranger", "app/server", 8080, false),
			// The stale pod's labels do not follow the address it lost.
			tcpTo("10.0.0.21", "app/server", 8080, false),
			// A hostNetwork pod's address is the node's, and a finished
			// pod's may be anyone's: neither is a peer.
			tcpTo("10.0.9.1", "app/server", 8080, false),
			tcpTo("10.0.0.30", "app/server", 8080, false),
			// Pods the policy does not select stay open.
			tcpTo("other/stranger", "app/client", 80, true),
		},
	},
	{
		name: "namespaceSelector peer is every pod of the matching namespaces",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "from-team-b", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}}}},
		})},
		conns: []conn{
			tcpTo("other/client", "app/server", 8080, true),
			tcpTo("other/stranger", "app/server", 8080, true),
			tcpTo("app/client", "app/server", 8080, false),
			tcpTo("unlisted/client", "app/server", 8080, false),
		},
	},
	{
		name: "namespaceSelector by metadata name works for a namespace not listed",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "from-unlisted", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: sel(corev1.LabelMetadataName, "unlisted"),
			}}}},
		})},
		conns: []conn{
			tcpTo("unlisted/client", "app/server", 8080, true),
			tcpTo("other/client", "app/server", 8080, false),
		},
	},
	{
		name: "podSelector and namespaceSelector combined must both match",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "clients-of-team-b", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: sel("team", "b"), PodSelector: sel("app", "client"),
			}}}},
		})},
		conns: []conn{
			tcpTo("other/client", "app/server", 8080, true),
			tcpTo("other/stranger", "app/server", 8080, false),
			tcpTo("app/client", "app/server", 8080, false),
			tcpTo("unlisted/client", "app/server", 8080, false),
		},
	},
	{
		name: "empty namespaceSelector with podSelector matches that pod in every namespace",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "clients-anywhere", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: sel(), PodSelector: sel("app", "client"),
			}}}},
		})},
		conns: []conn{
			tcpTo("other/client", "app/server", 8080, true),
			tcpTo("unlisted/client", "app/server", 8080, true),
			tcpTo("app/client", "app/server", 8080, true),
			tcpTo("other/stranger", "app/server", 8080, false),
		},
	},
	{
		name: "ipBlock with except",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "from-block", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24", "10.0.2.16/28"}},
			}, {
				IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8"},
			}}}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, true),
			tcpTo("10.0.255.1", "app/server", 8080, true),
			tcpTo("other/client", "app/server", 8080, false),
			tcpTo("unlisted/client", "app/server", 8080, false),
			tcpTo("10.0.2.15", "app/server", 8080, true),
			tcpTo("10.0.2.32", "app/server", 8080, true),
			tcpTo("10.1.0.1", "app/server", 8080, false),
			tcpTo("192.168.1.1", "app/server", 8080, false),
		},
	},
	{
		name: "ports by protocol, number, range and protocol alone",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "ports", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
				Ports: []networkingv1.NetworkPolicyPort{
					{Port: new(intstr.FromInt32(80))}, // TCP when unset
					portRange(tcp, 8000, 8080),
					portRange(tcp, 8070, 8090), // overlapping ranges merge
					port(sctp, 9000),
					{Protocol: new(udp)}, // every UDP port
				},
			}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 80, true),
			tcpTo("app/client", "app/server", 81, false),
			tcpTo("app/client", "app/server", 7999, false),
			tcpTo("app/client", "app/server", 8000, true),
			tcpTo("app/client", "app/server", 8090, true),
			tcpTo("app/client", "app/server", 8091, false),
			{from: "app/client", to: "app/server", proto: udp, port: 80, want: true},
			{from: "app/client", to: "app/server", proto: udp, port: 5353, want: true},
			{from: "app/client", to: "app/server", proto: sctp, port: 9000, want: true},
			{from: "app/client", to: "app/server", proto: sctp, port: 80, want: false},
			{from: "app/client", to: "app/server", proto: "icmp", want: false},
			{from: "other/client", to: "app/server", proto: udp, port: 53, want: false},
		},
	},
	{
		name: "ingress named ports resolve against each destination pod",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "http", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				port(tcp, "http"), port(udp, "dns"), port(tcp, "dns"), port(tcp, "missing"),
			}}},
		})},
		conns: []conn{
			tcpTo("other/stranger", "app/server", 8080, true),
			tcpTo("other/stranger", "app/server", 9090, false),
			tcpTo("other/stranger", "app/server2", 9090, true),
			tcpTo("other/stranger", "app/server2", 8080, false),
			{from: "other/stranger", to: "app/server", proto: udp, port: 53, want: true},
			// dns is a UDP port: the TCP entry resolves to nothing.
			tcpTo("other/stranger", "app/server", 53, false),
			{from: "other/stranger", to: "app/server2", proto: udp, port: 53, want: false},
		},
	},
	{
		name: "a rule whose named ports resolve to nothing allows nothing",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "missing", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				port(tcp, "http"),
			}}},
		})},
		conns: []conn{
			tcpTo("app/server", "app/client", 8080, false),
			tcpTo("app/server", "app/client", 1, false),
		},
	},
	{
		name: "egress named ports resolve against each destination pod",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "egress-http", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"),
			PolicyTypes: allowEgress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(), PodSelector: sel("app", "server")}, {IPBlock: &networkingv1.IPBlock{CIDR: "10.0.1.0/24"}}},
				Ports: []networkingv1.NetworkPolicyPort{port(tcp, "http")},
			}, {
				Ports: []networkingv1.NetworkPolicyPort{port(udp, "dns")},
			}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, true),
			tcpTo("app/client", "app/server", 9090, false),
			tcpTo("app/client", "app/server2", 9090, true),
			// A pod inside the ipBlock: its own number for the name.
			tcpTo("app/client", "other/web", 80, true),
			tcpTo("app/client", "other/web", 8080, false),
			// An address in the block that is no pod has no named ports.
			tcpTo("app/client", "10.0.1.99", 80, false),
			{from: "app/client", to: "app/server", proto: udp, port: 53, want: true},
			{from: "app/client", to: "other/web", proto: udp, port: 53, want: false},
			tcpTo("app/client", "192.168.1.1", 443, false),
			// Egress isolation alone leaves ingress open.
			tcpTo("other/stranger", "app/client", 1, true),
			tcpTo("app/server", "other/web", 80, true),
		},
	},
	{
		name: "policyTypes default to Ingress, and Egress when there are egress rules",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "both", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"),
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.10/32"}}},
			}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, true),
			tcpTo("app/client", "app/server2", 9090, false),
			tcpTo("app/server", "app/client", 8080, false),
		},
	},
	{
		name: "policyTypes Egress with no rules denies egress and leaves ingress open",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "deny-egress", networkingv1.NetworkPolicySpec{
			PodSelector: *sel(), PolicyTypes: allowEgress,
			// Ingress rules of a policy that does not isolate ingress are
			// ignored.
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16"}}}}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, false),
			tcpTo("app/client", "192.168.1.1", 443, false),
			tcpTo("other/client", "app/server", 8080, true),
			tcpTo("10.0.2.99", "app/server", 8080, true),
		},
	},
	{
		name: "policies and rules are a union",
		policies: []networkingv1.NetworkPolicy{
			testPolicy("app", "a", networkingv1.NetworkPolicySpec{
				PodSelector: *sel("app", "server"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
					Ports: []networkingv1.NetworkPolicyPort{port(tcp, 80)},
				}},
			}),
			testPolicy("app", "b", networkingv1.NetworkPolicySpec{
				PodSelector: *sel("app", "server"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}},
					Ports: []networkingv1.NetworkPolicyPort{port(tcp, 443)},
				}, {
					From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.1.1/32"}}},
				}},
			}),
			// A policy in another namespace selects nothing here.
			testPolicy("other", "deny", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server")}),
		},
		conns: []conn{
			tcpTo("app/client", "app/server", 80, true),
			tcpTo("app/client", "app/server", 443, false),
			tcpTo("other/stranger", "app/server", 443, true),
			tcpTo("other/stranger", "app/server", 80, false),
			tcpTo("192.168.1.1", "app/server", 1, true),
		},
	},
	{
		name: "an empty ingress rule allows everything",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "open", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{}},
		})},
		conns: []conn{
			tcpTo("192.168.1.1", "app/server", 1, true),
			{from: "other/stranger", to: "app/server", proto: "icmp", want: true},
		},
	},
	{
		name: "source egress and destination ingress must both allow",
		policies: []networkingv1.NetworkPolicy{
			testPolicy("app", "server-from-clients", networkingv1.NetworkPolicySpec{
				PodSelector: *sel("app", "server"),
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(), PodSelector: sel("app", "client")}}}},
			}),
			testPolicy("other", "client-to-server2", networkingv1.NetworkPolicySpec{
				PodSelector: *sel("app", "client"), PolicyTypes: allowEgress,
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.11/32"}}}}},
			}),
		},
		conns: []conn{
			tcpTo("other/client", "app/server2", 9090, true),
			tcpTo("other/client", "app/server", 8080, false),
			tcpTo("app/client", "app/server", 8080, true),
			tcpTo("other/stranger", "app/server2", 9090, false),
		},
	},
	{
		name: "a selector that matches no pod allows nothing",
		policies: []networkingv1.NetworkPolicy{testPolicy("app", "nobody", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "nobody")}}}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "nobody")}}}},
		})},
		conns: []conn{
			tcpTo("app/client", "app/server", 8080, false),
			tcpTo("app/server", "app/client", 8080, false),
		},
	},
}

// addrOf resolves a conn's end: a pod's address or an address.
func addrOf(t *testing.T, pods []corev1.Pod, end string) netip.Addr {
	t.Helper()
	if a, err := netip.ParseAddr(end); err == nil {
		return a
	}
	for _, p := range pods {
		if p.Namespace+"/"+p.Name == end {
			return netip.MustParseAddr(p.Status.PodIP)
		}
	}
	t.Fatalf("no pod %s", end)
	return netip.Addr{}
}

func TestCompileEnforcesNetworkPolicySemantics(t *testing.T) {
	for _, tc := range compileCases {
		t.Run(tc.name, func(t *testing.T) {
			pods := testPods()
			ruleset := Compile(pods, testNamespaces(), tc.policies)
			prog := parseRuleset(t, ruleset)
			for _, c := range tc.conns {
				pk := packet{src: addrOf(t, pods, c.from), dst: addrOf(t, pods, c.to), proto: strings.ToLower(string(c.proto)), port: c.port}
				if got := prog.allows(pk); got != c.want {
					t.Errorf("%s -> %s %s/%d: allowed=%v, want %v", c.from, c.to, pk.proto, c.port, got, c.want)
				}
			}
			if t.Failed() {
				t.Logf("ruleset:\n%s", ruleset)
			}
		})
	}
}

func TestCompileIsDeterministic(t *testing.T) {
	for _, tc := range compileCases {
		pods, namespaces := testPods(), testNamespaces()
		policies := append([]networkingv1.NetworkPolicy(nil), tc.policies...)
		want := Compile(pods, namespaces, policies)
		r := rand.New(rand.NewPCG(1, 2))
		for range 5 {
			r.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
			r.Shuffle(len(policies), func(i, j int) { policies[i], policies[j] = policies[j], policies[i] })
			if got := Compile(pods, namespaces, policies); got != want {
				t.Fatalf("%s: the ruleset depends on the order of its inputs:\n%s\n---\n%s", tc.name, want, got)
			}
		}
	}
}

func TestCompileNeverIsolatesHostNetworkPods(t *testing.T) {
	// hostNetwork pods share the node's address: isolating one would cut
	// the node's forwarded traffic.
	hostNet := testPod("kube-system", "proxy", "10.0.255.2", nil)
	hostNet.Spec.HostNetwork = true
	deny := testPolicy("kube-system", "deny", networkingv1.NetworkPolicySpec{PodSelector: *sel()})
	ruleset := Compile([]corev1.Pod{hostNet}, nil, []networkingv1.NetworkPolicy{deny})
	if strings.Contains(ruleset, "10.0.255.2") {
		t.Fatalf("a hostNetwork pod is in the rules:\n%s", ruleset)
	}
}

// scaleCluster is n replicas of a server behind a default deny that admits
// its clients, and n clients with egress to the servers and DNS.
func scaleCluster(n int) ([]corev1.Pod, []corev1.Namespace, []networkingv1.NetworkPolicy) {
	var pods []corev1.Pod
	for i := range n {
		pods = append(pods,
			testPod("shop", fmt.Sprintf("server-%d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), map[string]string{"app": "server"},
				containerPort("http", 8080, tcp)),
			testPod("shop", fmt.Sprintf("client-%d", i), fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), map[string]string{"app": "client"}))
	}
	pods = append(pods, testPod("kube-system", "coredns", "10.3.0.10", map[string]string{"k8s-app": "kube-dns"}, containerPort("dns", 53, udp)))
	policies := []networkingv1.NetworkPolicy{
		testPolicy("shop", "deny", networkingv1.NetworkPolicySpec{PodSelector: *sel()}),
		testPolicy("shop", "server", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
				Ports: []networkingv1.NetworkPolicyPort{port(tcp, "http")},
			}},
		}),
		testPolicy("shop", "client", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"), PolicyTypes: allowEgress,
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "server")}}, Ports: []networkingv1.NetworkPolicyPort{port(tcp, "http")}},
				{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(), PodSelector: sel("k8s-app", "kube-dns")}}, Ports: []networkingv1.NetworkPolicyPort{port(udp, "dns")}},
			},
		}),
	}
	return pods, []corev1.Namespace{testNamespace("shop", nil), testNamespace("kube-system", nil)}, policies
}

func TestCompileSharesChainsBetweenReplicas(t *testing.T) {
	pods, namespaces, policies := scaleCluster(300)
	ruleset := Compile(pods, namespaces, policies)
	// Servers share one ingress chain, clients another; clients share one
	// egress chain: the size grows with pods only by map and set elements.
	if got := strings.Count(ruleset, "\tchain ingress-"); got != 2 {
		t.Errorf("%d ingress chains for two kinds of pods, want 2", got)
	}
	if got := strings.Count(ruleset, "\tchain egress-"); got != 1 {
		t.Errorf("%d egress chains for one kind of pod, want 1", got)
	}
	prog := parseRuleset(t, ruleset)
	for _, c := range []struct {
		pk   packet
		want bool
	}{
		{packet{netip.MustParseAddr("10.2.1.7"), netip.MustParseAddr("10.1.0.200"), "tcp", 8080}, true},
		{packet{netip.MustParseAddr("10.2.1.7"), netip.MustParseAddr("10.1.0.200"), "tcp", 8081}, false},
		{packet{netip.MustParseAddr("10.2.1.7"), netip.MustParseAddr("10.3.0.10"), "udp", 53}, true},
		{packet{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2"), "tcp", 8080}, false},
		{packet{netip.MustParseAddr("10.2.0.1"), netip.MustParseAddr("10.2.0.2"), "tcp", 8080}, false},
	} {
		if got := prog.allows(c.pk); got != c.want {
			t.Errorf("%s: allowed=%v, want %v", c.pk, got, c.want)
		}
	}
}

func BenchmarkCompile300Replicas(b *testing.B) {
	pods, namespaces, policies := scaleCluster(300)
	for b.Loop() {
		Compile(pods, namespaces, policies)
	}
}
