package artifactserver

import (
	"container/list"
	"sync"
)

// builtArtifact is a tarball and its digest.
type builtArtifact struct {
	data   []byte
	digest string
}

// lruCache keeps recently served tarballs, bounded by their total size.
// Keys are UID/generation, so a recreated Program never hits a stale entry.
type lruCache struct {
	mu       sync.Mutex
	maxBytes int64
	size     int64
	order    *list.List // front = most recently used
	items    map[string]*list.Element
}

type cacheEntry struct {
	key   string
	value builtArtifact
}

// newLRUCache returns a cache of at most maxBytes; 0 or less caches nothing.
func newLRUCache(maxBytes int64) *lruCache {
	return &lruCache{maxBytes: maxBytes, order: list.New(), items: map[string]*list.Element{}}
}

func (c *lruCache) get(key string) (builtArtifact, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return builtArtifact{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*cacheEntry).value, true
}

func (c *lruCache) add(key string, value builtArtifact) {
	n := int64(len(value.data))
	if n > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.items[key] = c.order.PushFront(&cacheEntry{key: key, value: value})
	c.size += n
	for c.size > c.maxBytes {
		oldest := c.order.Back()
		e := oldest.Value.(*cacheEntry)
		c.order.Remove(oldest)
		delete(c.items, e.key)
		c.size -= int64(len(e.value.data))
	}
}

func (c *lruCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}
