package netpol

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// nftProgram runs the subset of nftables that Compile writes on one packet
// of a new connection, so tests can assert what a ruleset lets through
// rather than how it is written. Anything outside the subset fails the
// test: the evaluator must not silently ignore a rule.
type nftProgram struct {
	t      *testing.T
	chains map[string][][]string
}

// packet is the first packet of a connection crossing the forward hook.
type packet struct {
	src, dst netip.Addr
	proto    string // tcp, udp, sctp or icmp
	port     uint32 // destination port; 0 for icmp
}

var commentRE = regexp.MustCompile(` comment "[^"]*"`)

func parseRuleset(t *testing.T, text string) *nftProgram {
	t.Helper()
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	header := []string{
		"table inet " + Table + " {}",
		"delete table inet " + Table,
		"table inet " + Table + " {",
	}
	if len(lines) < 4 || strings.Join(lines[:3], "\n") != strings.Join(header, "\n") || lines[len(lines)-1] != "}" {
		t.Fatalf("ruleset does not replace the table atomically:\n%s", text)
	}
	p := &nftProgram{t: t, chains: map[string][][]string{}}
	var current string
	for _, line := range lines[3 : len(lines)-1] {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain ") && strings.HasSuffix(line, " {"):
			current = strings.TrimSuffix(strings.TrimPrefix(line, "chain "), " {")
			p.chains[current] = [][]string{}
		case line == "}":
			current = ""
		case current == "":
			t.Fatalf("rule outside a chain: %q", line)
		case strings.HasPrefix(line, "type "):
			if current != "forward" || line != "type filter hook forward priority filter; policy accept;" {
				t.Fatalf("unexpected base chain %s: %q", current, line)
			}
		default:
			line = commentRE.ReplaceAllString(line, "")
			for _, sep := range []string{"{", "}", ","} {
				line = strings.ReplaceAll(line, sep, " "+sep+" ")
			}
			p.chains[current] = append(p.chains[current], strings.Fields(line))
		}
	}
	if _, ok := p.chains["forward"]; !ok {
		t.Fatalf("ruleset has no forward chain:\n%s", text)
	}
	return p
}

// allows reports whether the forward hook lets pk through.
func (p *nftProgram) allows(pk packet) bool {
	switch v := p.run("forward", pk, 0); v {
	case "drop":
		return false
	case "accept", "return", "":
		return true
	default:
		p.t.Fatalf("forward chain ended with %q", v)
		return false
	}
}

func (p *nftProgram) run(chain string, pk packet, depth int) string {
	rules, ok := p.chains[chain]
	if !ok || depth > 8 {
		p.t.Fatalf("jump to unknown chain %q (or a loop)", chain)
	}
	for _, rule := range rules {
		v := p.rule(rule, pk)
		switch {
		case v == "":
			continue
		case strings.HasPrefix(v, "jump "):
			switch r := p.run(strings.TrimPrefix(v, "jump "), pk, depth+1); r {
			case "accept", "drop":
				return r
			}
		default:
			return v
		}
	}
	return ""
}

// rule evaluates one rule: its verdict, or "" when a match fails.
func (p *nftProgram) rule(tokens []string, pk packet) string {
	i := 0
	next := func() string {
		if i >= len(tokens) {
			p.t.Fatalf("rule ends early: %v", tokens)
		}
		i++
		return tokens[i-1]
	}
	for i < len(tokens) {
		tok := next()
		switch tok {
		case "accept", "drop", "return":
			if i != len(tokens) {
				p.t.Fatalf("tokens after the verdict: %v", tokens)
			}
			return tok
		case "counter":
			continue
		case "ip", "th", "meta", "ct":
			keys := []string{tok + " " + next()}
			for i < len(tokens) && tokens[i] == "." {
				next()
				keys = append(keys, next()+" "+next())
			}
			if tokens[i] == "vmap" {
				next()
				for _, el := range p.elements(next, true) {
					if p.matches(keys, el[:len(el)-1], pk) {
						return el[len(el)-1]
					}
				}
				return ""
			}
			matched := false
			for _, el := range p.elements(next, false) {
				matched = matched || p.matches(keys, el, pk)
			}
			if !matched {
				return ""
			}
		default:
			p.t.Fatalf("unknown token %q in %v", tok, tokens)
		}
	}
	p.t.Fatalf("rule without a verdict: %v", tokens)
	return ""
}

// elements reads a set (or a single value) as tuples of values; for a
// verdict map the last value of each tuple is the verdict.
func (p *nftProgram) elements(next func() string, vmap bool) [][]string {
	first := next()
	if first != "{" {
		if vmap {
			p.t.Fatalf("verdict map without braces")
		}
		return [][]string{{first}}
	}
	var out [][]string
	var el []string
	for {
		tok := next()
		switch tok {
		case "}", ",":
			if vmap {
				if len(el) < 4 || el[len(el)-3] != ":" || el[len(el)-2] != "jump" {
					p.t.Fatalf("bad verdict map element %v", el)
				}
				el = append(el[:len(el)-3], "jump "+el[len(el)-1])
			}
			out = append(out, el)
			el = nil
			if tok == "}" {
				return out
			}
		case ".":
		default:
			el = append(el, tok)
		}
	}
}

func (p *nftProgram) matches(keys, values []string, pk packet) bool {
	if len(keys) != len(values) {
		p.t.Fatalf("keys %v do not fit element %v", keys, values)
	}
	for k, key := range keys {
		v := values[k]
		var ok bool
		switch key {
		case "ip saddr":
			ok = addrIn(p.t, pk.src, v)
		case "ip daddr":
			ok = addrIn(p.t, pk.dst, v)
		case "meta l4proto":
			ok = pk.proto == v
		case "th dport":
			ok = pk.proto != "icmp" && portIn(p.t, pk.port, v)
		case "ct state":
			// Every packet the tests send opens a connection.
			ok = false
		default:
			p.t.Fatalf("unknown key %q", key)
		}
		if !ok {
			return false
		}
	}
	return true
}

func addrIn(t *testing.T, a netip.Addr, v string) bool {
	if lo, hi, ok := strings.Cut(v, "-"); ok {
		l, h := netip.MustParseAddr(lo), netip.MustParseAddr(hi)
		return l.Compare(a) <= 0 && a.Compare(h) <= 0
	}
	if strings.Contains(v, "/") {
		pfx := netip.MustParsePrefix(v)
		if pfx != pfx.Masked() {
			t.Fatalf("prefix %s has host bits", v)
		}
		return pfx.Contains(a)
	}
	return netip.MustParseAddr(v) == a
}

func portIn(t *testing.T, port uint32, v string) bool {
	lo, hi, ok := strings.Cut(v, "-")
	if !ok {
		hi = lo
	}
	l, err1 := strconv.ParseUint(lo, 10, 16)
	h, err2 := strconv.ParseUint(hi, 10, 16)
	if err1 != nil || err2 != nil || l > h {
		t.Fatalf("bad port value %q", v)
	}
	return uint64(port) >= l && uint64(port) <= h
}

func (pk packet) String() string {
	return fmt.Sprintf("%s -> %s %s/%d", pk.src, pk.dst, pk.proto, pk.port)
}
