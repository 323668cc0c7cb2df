package secrets

import (
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

func genKey(i int) client.ObjectKey {
	return client.ObjectKey{Namespace: "team", Name: fmt.Sprintf("stack-%d", i)}
}

// The index cache stays within two generations whatever the fleet, and
// keeps what was used lately: an entry read after its generation aged is
// still there after the next rotation; one nobody read is gone.
func TestIndexCacheGenerationsKeepWhatWasUsedLately(t *testing.T) {
	var g generations[int]
	for i := range 10 * maxCachedIndexes {
		g.put(genKey(i), i)
		if n := len(g.young) + len(g.old); n > 2*maxCachedIndexes {
			t.Fatalf("%d entries after %d puts, want at most %d", n, i+1, 2*maxCachedIndexes)
		}
	}
	// The last maxCachedIndexes and more are kept; the first are gone.
	last := 10*maxCachedIndexes - 1
	if v, ok := g.get(genKey(last)); !ok || v != last {
		t.Errorf("the last entry: %d, %v", v, ok)
	}
	if _, ok := g.get(genKey(0)); ok {
		t.Error("the first of ten generations' entries is still cached")
	}

	// Fill the young generation until genKey(used) is in the old one; read
	// it there, then rotate once more: it survives, its neighbour does not.
	var h generations[int]
	for i := range maxCachedIndexes + 1 {
		h.put(genKey(i), i)
	}
	used, unused := 10, 11
	if _, inOld := h.old[genKey(used)]; !inOld {
		t.Fatal("the entry did not age into the old generation")
	}
	if _, ok := h.get(genKey(used)); !ok {
		t.Fatal("an entry of the old generation is not found")
	}
	for i := range maxCachedIndexes {
		h.put(genKey(100000+i), i)
	}
	if _, ok := h.get(genKey(used)); !ok {
		t.Error("an entry read from the old generation was dropped at the next rotation")
	}
	if _, ok := h.get(genKey(unused)); ok {
		t.Error("an entry nobody read survived two rotations")
	}
	h.delete(genKey(used))
	if _, ok := h.get(genKey(used)); ok {
		t.Error("a deleted entry is still found")
	}
}
