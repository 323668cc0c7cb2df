package secrets

import (
	"bytes"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
)

// A state request used to cost up to four API calls: a read of the index
// for the lock check, another for the write's preconditions, the write,
// and for a read of the state a third read of the index for its size.
// Two small caches bring that to one call per request without giving up
// the compare-and-swap every change relies on:
//
//   - indexCache keeps each index Secret as this Store last read or wrote
//     it. A change starts from that copy; the update carries its
//     resourceVersion, so a copy that another writer (another replica)
//     made stale is refused with a conflict, read again and the change
//     tried again. A change that a cached copy refuses, or finds already
//     made, is decided again on a fresh read: only a successful write is
//     taken on a copy's word. Reads of the state (Get, ListVersions,
//     GetLock, Migrated) always read the index from the API server.
//   - chunkCache keeps the bytes of small chunk Secrets. Chunks are
//     immutable and named by a random write ID, and every use checks the
//     bytes against the digest in the (freshly read) index, so a cached
//     chunk is the chunk.

// maxCachedIndexes bounds each generation of indexCache (an index is about
// 2 KiB). A run uses its index several times within minutes, so the copies
// that save most are those of the runs going on; the next run of a Stack
// an interval later saves one read. Measured at 10,000 Stacks, a cache of
// 5000 that started over when full held 10.6 MiB of the controller's live
// heap and, cycling through twice as many Stacks, rarely answered a run.
const maxCachedIndexes = 1024

// indexCache maps an index Secret's name to its last known object; a nil
// object means it was found not to exist.
type indexCache struct {
	mu      sync.Mutex
	entries generations[*corev1.Secret]
	// lockedBy names, for an entry this Store's Lock (or its Unlock of an
	// apply lock) wrote, the lock's owner and the resourceVersion it left:
	// the copy answers for that owner while it is still the entry.
	lockedBy generations[lockCopy]
}

type lockCopy struct {
	owner, resourceVersion string
	// released: the copy is what releasing the owner's apply lock left.
	released bool
}

// markLock records that obj, just cached, is what taking (or releasing)
// owner's lock left.
func (c *indexCache) markLock(key client.ObjectKey, owner string, released bool, obj *corev1.Secret) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lockedBy.put(key, lockCopy{owner: owner, resourceVersion: obj.ResourceVersion, released: released})
}

// lockCopyOf returns the cached index if this Store's taking (released
// false) or releasing of owner's lock is still the last it knows of key.
func (c *indexCache) lockCopyOf(key client.ObjectKey, owner string, released bool) *corev1.Secret {
	c.mu.Lock()
	defer c.mu.Unlock()
	obj, _ := c.entries.get(key)
	l, _ := c.lockedBy.get(key)
	if obj == nil || owner == "" || l.owner != owner || l.released != released || l.resourceVersion != obj.ResourceVersion {
		return nil
	}
	return obj.DeepCopy()
}

// get returns a copy of the cached object, and whether there was an entry.
func (c *indexCache) get(key client.ObjectKey) (*corev1.Secret, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	obj, ok := c.entries.get(key)
	if obj != nil {
		obj = obj.DeepCopy()
	}
	return obj, ok
}

// put remembers obj (nil: absent) as the latest known index, without its
// managedFields, which an update does not need.
func (c *indexCache) put(key client.ObjectKey, obj *corev1.Secret) {
	if obj != nil {
		obj = obj.DeepCopy()
		obj.ManagedFields = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries.put(key, obj)
}

func (c *indexCache) forget(key client.ObjectKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries.delete(key)
}

// generations is a map of at most twice maxCachedIndexes entries that
// drops the least recently used first, roughly: entries go into the young
// generation; a full young generation becomes the old one, and the old one
// is dropped; an entry found in the old generation moves back to the young
// one. The caller locks.
type generations[V any] struct {
	young, old map[client.ObjectKey]V
}

func (g *generations[V]) get(key client.ObjectKey) (V, bool) {
	if v, ok := g.young[key]; ok {
		return v, true
	}
	v, ok := g.old[key]
	if ok {
		delete(g.old, key)
		g.put(key, v)
	}
	return v, ok
}

func (g *generations[V]) put(key client.ObjectKey, v V) {
	if _, ok := g.young[key]; !ok && len(g.young) >= maxCachedIndexes {
		g.old, g.young = g.young, nil
	}
	if g.young == nil {
		g.young = make(map[client.ObjectKey]V)
	}
	delete(g.old, key)
	g.young[key] = v
}

func (g *generations[V]) delete(key client.ObjectKey) {
	delete(g.young, key)
	delete(g.old, key)
}

// Bounds of chunkCache: states of small Stacks fit whole; large ones are
// read from the API server as before.
const (
	maxCachedChunkBytes = 64 << 10
	maxChunkCacheBytes  = 8 << 20
)

// chunkCache keeps chunk bytes by Secret name, oldest dropped first.
type chunkCache struct {
	mu    sync.Mutex
	data  map[client.ObjectKey][]byte
	order []client.ObjectKey
	bytes int
}

// get returns the cached bytes of the chunk c names, if they match it.
func (cc *chunkCache) get(namespace string, c chunkRef) ([]byte, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	data, ok := cc.data[client.ObjectKey{Namespace: namespace, Name: c.Name}]
	if !ok || len(data) != c.Size || state.Digest(data) != c.Digest {
		return nil, false
	}
	return data, true
}

// put keeps a copy of data as the bytes of the chunk name.
func (cc *chunkCache) put(namespace, name string, data []byte) {
	if len(data) > maxCachedChunkBytes {
		return
	}
	data = bytes.Clone(data)
	key := client.ObjectKey{Namespace: namespace, Name: name}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.data == nil {
		cc.data = map[client.ObjectKey][]byte{}
	}
	if _, ok := cc.data[key]; ok {
		return
	}
	for cc.bytes+len(data) > maxChunkCacheBytes && len(cc.order) > 0 {
		oldest := cc.order[0]
		cc.order = cc.order[1:]
		cc.bytes -= len(cc.data[oldest])
		delete(cc.data, oldest)
	}
	cc.data[key] = data
	cc.order = append(cc.order, key)
	cc.bytes += len(data)
}

func (cc *chunkCache) forget(namespace, name string) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if data, ok := cc.data[key]; ok {
		cc.bytes -= len(data)
		delete(cc.data, key)
		// order keeps the key until it comes up; a later put finds it gone.
	}
}
