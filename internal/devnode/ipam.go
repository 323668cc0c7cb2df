package devnode

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
)

// ipPool hands out loopback addresses to pods, round-robin so that an
// address is not reused while a client may still hold a connection to it.
type ipPool struct {
	mu     sync.Mutex
	prefix netip.Prefix
	next   netip.Addr
	inUse  map[netip.Addr]bool
}

// newIPPool parses a loopback subnet such as "127.0.0.0/24". An empty
// subnet picks a random 127.x.y.0/24, so that several devnodes on one
// machine (parallel tests) do not hand out the same addresses.
func newIPPool(subnet string) (*ipPool, error) {
	if subnet == "" {
		subnet = fmt.Sprintf("127.%d.%d.0/24", 1+rand.IntN(254), rand.IntN(256))
	}
	prefix, err := netip.ParsePrefix(subnet)
	if err != nil {
		return nil, fmt.Errorf("failed to parse pod subnet %q: %w", subnet, err)
	}
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() || !prefix.Addr().IsLoopback() || prefix.Bits() > 30 {
		return nil, fmt.Errorf("pod subnet %q must be an IPv4 loopback range of at least 4 addresses (for example 127.0.0.0/24)", subnet)
	}
	return &ipPool{prefix: prefix, next: first(prefix), inUse: map[netip.Addr]bool{}}, nil
}

// first is the first usable address: the network address and .1 (the
// host's own 127.0.0.1 in 127.0.0.0/24) are skipped.
func first(p netip.Prefix) netip.Addr {
	return p.Addr().Next().Next()
}

func (p *ipPool) allocate() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.next
	for {
		addr := p.next
		p.next = addr.Next()
		if !p.prefix.Contains(p.next) || isBroadcast(p.prefix, p.next) {
			p.next = first(p.prefix)
		}
		if !p.inUse[addr] {
			p.inUse[addr] = true
			return addr.String(), nil
		}
		if p.next == start {
			return "", fmt.Errorf("no free address left in pod subnet %s", p.prefix)
		}
	}
}

func (p *ipPool) release(ip string) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inUse, addr)
}

func isBroadcast(p netip.Prefix, a netip.Addr) bool {
	return p.Contains(a) && !p.Contains(a.Next())
}
