package devcluster

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strconv"
)

// network is the address plan of one dev cluster: a /16 of 10.0.0.0/8 that
// nothing else on this machine routes, split into
//
//	10.S.255.0/30   the link between the host (.1) and the node (.2)
//	10.S.0.0/17     pod addresses (the node's bridge is 10.S.0.1)
//	10.S.128.0/18   Service addresses (kubernetes is .1, kube-dns .10)
//
// S is the cluster's slot. Two dev clusters on one machine take different
// slots, so their ranges never overlap. These addresses exist only on the
// host end of the link and inside the network namespaces the cluster
// creates; pod traffic bound anywhere else is dropped (see sandboxInit).
type network struct {
	Slot int
	// HostIf is the host's end of the link, "tdev<S>".
	HostIf string
	HostIP net.IP
	NodeIP net.IP
	// LinkPrefix is the link's prefix length (30).
	LinkPrefix  int
	PodCIDR     *net.IPNet
	ServiceCIDR *net.IPNet
	// BridgeIP is the pods' gateway on the node.
	BridgeIP net.IP
	// APIServiceIP and DNSServiceIP are the kubernetes and kube-dns
	// Services' cluster IPs.
	APIServiceIP net.IP
	DNSServiceIP net.IP
}

const (
	firstSlot = 200
	lastSlot  = 249
)

func networkForSlot(slot int) network {
	ip := func(c, d byte) net.IP { return net.IPv4(10, byte(slot), c, d).To4() }
	cidr := func(c byte, bits int) *net.IPNet {
		return &net.IPNet{IP: ip(c, 0), Mask: net.CIDRMask(bits, 32)}
	}
	return network{
		Slot:         slot,
		HostIf:       "tdev" + strconv.Itoa(slot),
		HostIP:       ip(255, 1),
		NodeIP:       ip(255, 2),
		LinkPrefix:   30,
		PodCIDR:      cidr(0, 17),
		ServiceCIDR:  cidr(128, 18),
		BridgeIP:     ip(0, 1),
		APIServiceIP: ip(128, 1),
		DNSServiceIP: ip(128, 10),
	}
}

// block is the slot's whole /16.
func (n network) block() *net.IPNet {
	return &net.IPNet{IP: net.IPv4(10, byte(n.Slot), 0, 0).To4(), Mask: net.CIDRMask(16, 32)}
}

// freeSlots lists the slots whose /16 no interface address or route of the
// host's network namespace overlaps, in order. Another dev cluster holds its
// slot through its tdev<S> link and the routes on it.
func freeSlots() ([]int, error) {
	taken, err := hostPrefixes()
	if err != nil {
		return nil, err
	}
	var free []int
	for slot := firstSlot; slot <= lastSlot; slot++ {
		block := networkForSlot(slot).block()
		clash := false
		for _, p := range taken {
			if p.Contains(block.IP) || block.Contains(p.IP) {
				clash = true
				break
			}
		}
		if !clash {
			free = append(free, slot)
		}
	}
	if len(free) == 0 {
		return nil, fmt.Errorf("every address block 10.%d.0.0/16 to 10.%d.0.0/16 is in use on this machine: stop another terrace dev or remove the routes that cover them", firstSlot, lastSlot)
	}
	return free, nil
}

// hostPrefixes are the prefixes of the host's routes and interface
// addresses (IPv4), read with iproute2's JSON output.
func hostPrefixes() ([]*net.IPNet, error) {
	var out []*net.IPNet
	routes, err := ipJSON("-4", "route", "show", "table", "all")
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		dst, _ := r["dst"].(string)
		if p := parsePrefix(dst); p != nil {
			out = append(out, p)
		}
	}
	addrs, err := ipJSON("-4", "addr", "show")
	if err != nil {
		return nil, err
	}
	for _, link := range addrs {
		infos, _ := link["addr_info"].([]any)
		for _, info := range infos {
			m, _ := info.(map[string]any)
			local, _ := m["local"].(string)
			plen, _ := m["prefixlen"].(float64)
			if p := parsePrefix(local + "/" + strconv.Itoa(int(plen))); p != nil {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// parsePrefix reads "a.b.c.d/n" or a bare address; nil for "default" and
// anything that is not IPv4. A default route is not a clash: it is the
// least specific route and never hides the slot's own.
func parsePrefix(s string) *net.IPNet {
	if _, p, err := net.ParseCIDR(s); err == nil {
		if p.IP.To4() == nil {
			return nil
		}
		return p
	}
	if ip := net.ParseIP(s).To4(); ip != nil {
		return &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}
	}
	return nil
}

func ipJSON(args ...string) ([]map[string]any, error) {
	out, err := exec.Command("ip", append([]string{"-j"}, args...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("failed to run ip %v: %w", args, commandError(err))
	}
	var v []map[string]any
	if len(out) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("failed to read the output of ip %v: %w", args, err)
	}
	return v, nil
}

// commandError adds a command's stderr to its error.
func commandError(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, ee.Stderr)
	}
	return err
}
