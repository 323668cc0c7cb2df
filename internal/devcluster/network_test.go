package devcluster

import (
	"net"
	"testing"
)

func TestNetworkPlanKeepsEveryRangeInsideItsSlot(t *testing.T) {
	for _, slot := range []int{firstSlot, 217, lastSlot} {
		n := networkForSlot(slot)
		block := n.block()
		link := &net.IPNet{IP: n.HostIP.Mask(net.CIDRMask(n.LinkPrefix, 32)), Mask: net.CIDRMask(n.LinkPrefix, 32)}
		for name, ip := range map[string]net.IP{"host": n.HostIP, "node": n.NodeIP, "bridge": n.BridgeIP, "kubernetes Service": n.APIServiceIP, "kube-dns": n.DNSServiceIP} {
			if !block.Contains(ip) {
				t.Errorf("slot %d: the %s address %s is outside %s", slot, name, ip, block)
			}
		}
		if !link.Contains(n.NodeIP) {
			t.Errorf("slot %d: node %s and host %s are not on one /%d", slot, n.NodeIP, n.HostIP, n.LinkPrefix)
		}
		if !n.PodCIDR.Contains(n.BridgeIP) || !n.ServiceCIDR.Contains(n.APIServiceIP) || !n.ServiceCIDR.Contains(n.DNSServiceIP) {
			t.Errorf("slot %d: the bridge must be in the pod range and the Services in the Service range: %+v", slot, n)
		}
		for _, pair := range [][2]*net.IPNet{{n.PodCIDR, n.ServiceCIDR}, {n.PodCIDR, link}, {n.ServiceCIDR, link}} {
			if overlaps(pair[0], pair[1]) {
				t.Errorf("slot %d: %s overlaps %s", slot, pair[0], pair[1])
			}
		}
	}
}

func TestNetworkPlanSlotsAreDisjoint(t *testing.T) {
	a, b := networkForSlot(firstSlot), networkForSlot(firstSlot+1)
	if overlaps(a.block(), b.block()) || a.HostIf == b.HostIf {
		t.Fatalf("two dev clusters would share addresses or a link: %+v and %+v", a, b)
	}
}

func TestParsePrefixIgnoresWhatCannotClash(t *testing.T) {
	for in, want := range map[string]string{
		"default":       "",
		"fe80::/64":     "",
		"10.201.0.0/16": "10.201.0.0/16",
		"10.255.255.53": "10.255.255.53/32",
	} {
		got := parsePrefix(in)
		if (got == nil) != (want == "") || (got != nil && got.String() != want) {
			t.Errorf("parsePrefix(%q) = %v, want %q", in, got, want)
		}
	}
}

func overlaps(a, b *net.IPNet) bool { return a.Contains(b.IP) || b.Contains(a.IP) }

func TestRepositoryPathDropsTheRegistry(t *testing.T) {
	for in, want := range map[string]string{
		"registry.k8s.io/pause:3.10":              "pause:3.10",
		"registry.k8s.io/coredns/coredns:v1.15.0": "coredns/coredns:v1.15.0",
		"ghcr.io/terrace-dev/terrace:v0.1.0":      "terrace-dev/terrace:v0.1.0",
		"localhost/x:1":                           "x:1",
		"library/busybox:1":                       "library/busybox:1",
	} {
		if got := repositoryPath(in); got != want {
			t.Errorf("repositoryPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestImageTagPatternFindsTheManifestsTags(t *testing.T) {
	manifests := []byte("image: ghcr.io/terrace-dev/terrace:v0.1.0\n  image: ghcr.io/terrace-dev/terrace:dev-1\nimage: ghcr.io/other/terrace:x\n")
	var tags []string
	for _, m := range imageTagPattern.FindAllSubmatch(manifests, -1) {
		tags = append(tags, string(m[1]))
	}
	if len(tags) != 2 || tags[0] != "v0.1.0" || tags[1] != "dev-1" {
		t.Fatalf("found tags %q", tags)
	}
}
