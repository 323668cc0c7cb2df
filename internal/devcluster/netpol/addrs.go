package netpol

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// span is an inclusive range of numbers: IPv4 addresses or ports.
type span struct{ lo, hi uint32 }

// spans is a sorted list of disjoint, non-adjacent spans: the form nftables
// wants for an interval set, whose elements must not overlap.
type spans []span

// normalize sorts and merges s in place.
func normalize(s []span) spans {
	if len(s) == 0 {
		return nil
	}
	slices.SortFunc(s, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	out := s[:1]
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		if last.hi == ^uint32(0) || x.lo <= last.hi+1 {
			last.hi = max(last.hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// minus returns s without the numbers of cut.
func (s spans) minus(cut span) spans {
	var out spans
	for _, x := range s {
		if cut.hi < x.lo || cut.lo > x.hi {
			out = append(out, x)
			continue
		}
		if cut.lo > x.lo {
			out = append(out, span{x.lo, cut.lo - 1})
		}
		if cut.hi < x.hi {
			out = append(out, span{cut.hi + 1, x.hi})
		}
	}
	return out
}

func (s spans) contains(n uint32) bool {
	i, _ := slices.BinarySearchFunc(s, n, func(x span, n uint32) int {
		switch {
		case x.hi < n:
			return -1
		case x.lo > n:
			return 1
		}
		return 0
	})
	return i < len(s) && s[i].lo <= n && n <= s[i].hi
}

// addrNum is a as a number; a must be IPv4.
func addrNum(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func numAddr(n uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return netip.AddrFrom4(b)
}

// prefixSpan is the addresses of an IPv4 prefix.
func prefixSpan(p netip.Prefix) span {
	lo := addrNum(p.Masked().Addr())
	host := uint32((uint64(1) << (32 - p.Bits())) - 1)
	return span{lo, lo | host}
}

// parseIPv4Prefix parses an ipBlock's CIDR; ok is false for IPv6 and for
// what does not parse (the API server refuses it).
func parseIPv4Prefix(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, false
	}
	return p, true
}

// addrElements formats s as the elements of an nftables address set.
func (s spans) addrElements() []string {
	out := make([]string, 0, len(s))
	for _, x := range s {
		switch {
		case x.lo == x.hi:
			out = append(out, numAddr(x.lo).String())
		case isPrefix(x):
			out = append(out, numAddr(x.lo).String()+"/"+strconv.Itoa(32-bits.Len32(x.hi-x.lo)))
		default:
			out = append(out, numAddr(x.lo).String()+"-"+numAddr(x.hi).String())
		}
	}
	return out
}

// isPrefix reports whether x is exactly the addresses of one prefix.
func isPrefix(x span) bool {
	size := uint64(x.hi-x.lo) + 1
	return size&(size-1) == 0 && uint64(x.lo)%size == 0
}

// portElements formats s as the elements of an nftables port set.
func (s spans) portElements() []string {
	out := make([]string, 0, len(s))
	for _, x := range s {
		if x.lo == x.hi {
			out = append(out, strconv.FormatUint(uint64(x.lo), 10))
		} else {
			out = append(out, strconv.FormatUint(uint64(x.lo), 10)+"-"+strconv.FormatUint(uint64(x.hi), 10))
		}
	}
	return out
}

// set formats elements as an nftables anonymous set, or as the single
// value when there is one.
func set(elements []string) string {
	if len(elements) == 1 {
		return elements[0]
	}
	return "{ " + strings.Join(elements, ", ") + " }"
}
