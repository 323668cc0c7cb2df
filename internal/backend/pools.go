package backend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPoolCloseGrace is how long a PostgreSQL pool no cached store uses
// any more stays open for callers still holding those stores, before it is
// closed.
const DefaultPoolCloseGrace = time.Minute

// poolCache shares one pool per connection string among the namespaces
// that use it, counts its users, and closes it when the last one lets go:
// when a namespace's config names another connection, its connection
// Secret changes, its state moves away, or Backends closes.
type poolCache struct {
	mu    sync.Mutex
	pools map[string]*sharedPool
	grace time.Duration
}

type sharedPool struct {
	pool *pgxpool.Pool
	refs int
}

func newPoolCache(grace time.Duration) *poolCache {
	return &poolCache{pools: map[string]*sharedPool{}, grace: grace}
}

func poolID(connString string) string {
	sum := sha256.Sum256([]byte(connString))
	return hex.EncodeToString(sum[:])
}

// acquire returns the pool of cfg's connection string, creating it when
// none is open, and the func that releases this use of it.
func (c *poolCache) acquire(ctx context.Context, connString string, cfg *pgxpool.Config) (*pgxpool.Pool, func(), error) {
	id := poolID(connString)
	c.mu.Lock()
	defer c.mu.Unlock()
	sp, ok := c.pools[id]
	if !ok {
		// The pool connects lazily, so holding the lock here costs no round trip.
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		sp = &sharedPool{pool: p}
		c.pools[id] = sp
	}
	sp.refs++
	var once sync.Once
	return sp.pool, func() { once.Do(func() { c.release(id, sp) }) }, nil
}

func (c *poolCache) release(id string, sp *sharedPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sp.refs--
	if sp.refs > 0 || c.pools[id] != sp {
		return
	}
	delete(c.pools, id)
	// Close waits for borrowed connections; never block the caller on it.
	time.AfterFunc(c.grace, sp.pool.Close)
}

// closeAll closes every pool now.
func (c *poolCache) closeAll() {
	c.mu.Lock()
	pools := c.pools
	c.pools = map[string]*sharedPool{}
	c.mu.Unlock()
	for _, sp := range pools {
		sp.pool.Close()
	}
}
