package devnode

import (
	"net/netip"
	"testing"
)

func TestIPPoolSkipsReservedAndReusesLast(t *testing.T) {
	p, err := newIPPool("127.0.0.0/30")
	if err != nil {
		t.Fatal(err)
	}
	// /30 = .0 (network) .1 (the host) .2 .3 (broadcast): one address.
	ip, err := p.allocate()
	if err != nil || ip != "127.0.0.2" {
		t.Fatalf("got %q, %v; want 127.0.0.2", ip, err)
	}
	if _, err := p.allocate(); err == nil {
		t.Fatal("expected the pool to be exhausted")
	}
	p.release(ip)
	if again, err := p.allocate(); err != nil || again != ip {
		t.Fatalf("got %q, %v after release", again, err)
	}
}

func TestIPPoolRoundRobin(t *testing.T) {
	p, err := newIPPool("127.0.0.0/24")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := p.allocate()
	p.release(a)
	b, _ := p.allocate()
	if a == b {
		t.Fatalf("a released address %s was handed out again at once", a)
	}
}

func TestIPPoolRandomSubnetIsLoopback(t *testing.T) {
	p, err := newIPPool("")
	if err != nil {
		t.Fatal(err)
	}
	ip, err := p.allocate()
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr(ip)
	if !addr.IsLoopback() || addr == netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("unexpected pod address %s", ip)
	}
}

func TestIPPoolRefusesNonLoopback(t *testing.T) {
	if _, err := newIPPool("10.0.0.0/24"); err == nil {
		t.Fatal("a non-loopback subnet was accepted")
	}
}
