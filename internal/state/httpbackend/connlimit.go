package httpbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/terrace-dev/terrace/internal/pki"
)

// errTooManyConnections says a client holds too many connections (429).
var errTooManyConnections = errors.New("too many connections to the state server")

// connectionLimits caps the connections one run (a runner identity, or
// any other identity but the controller's) and one namespace hold at
// once. A connection counts from its first request until it closes, idle
// keep-alive time included: a tenant cannot fill the server's connection
// limit with connections it keeps open. The controller's identity is not
// capped. Each replica counts its own connections.
type connectionLimits struct {
	perIdentity, perNamespace int

	mu          sync.Mutex
	conns       map[net.Conn]*connUse
	byIdentity  map[pki.Identity]int
	byNamespace map[string]int
}

// connUse is what a connection counts against.
type connUse struct {
	counted   bool
	identity  pki.Identity
	namespace string
}

type connUseKey struct{}

func newConnectionLimits(perIdentity, perNamespace int) *connectionLimits {
	return &connectionLimits{
		perIdentity: perIdentity, perNamespace: perNamespace,
		conns: map[net.Conn]*connUse{}, byIdentity: map[pki.Identity]int{}, byNamespace: map[string]int{},
	}
}

// connContext registers a new connection (http.Server.ConnContext).
func (l *connectionLimits) connContext(ctx context.Context, c net.Conn) context.Context {
	use := &connUse{}
	l.mu.Lock()
	l.conns[c] = use
	l.mu.Unlock()
	return context.WithValue(ctx, connUseKey{}, use)
}

// forget gives a closed connection's count back (http.Server.ConnState,
// on StateClosed and StateHijacked).
func (l *connectionLimits) forget(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	use := l.conns[c]
	delete(l.conns, c)
	l.uncountLocked(use)
}

// closing gives back the count of the connection of a request answered
// for the last time on it (Connection: close).
func (l *connectionLimits) closing(ctx context.Context) {
	use, _ := ctx.Value(connUseKey{}).(*connUse)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.uncountLocked(use)
}

func (l *connectionLimits) uncountLocked(use *connUse) {
	if use == nil || !use.counted {
		return
	}
	use.counted = false
	if l.byIdentity[use.identity]--; l.byIdentity[use.identity] <= 0 {
		delete(l.byIdentity, use.identity)
	}
	if use.namespace != "" {
		if l.byNamespace[use.namespace]--; l.byNamespace[use.namespace] <= 0 {
			delete(l.byNamespace, use.namespace)
		}
	}
}

// admit counts the connection of a request against id (once per
// connection: its client certificate never changes), or says why it may
// not have it.
func (l *connectionLimits) admit(ctx context.Context, id pki.Identity) error {
	use, _ := ctx.Value(connUseKey{}).(*connUse)
	if use == nil || id == pki.ControllerIdentity {
		return nil
	}
	ns := identityNamespace(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if use.counted {
		return nil
	}
	if n := l.byIdentity[id]; n >= l.perIdentity {
		return fmt.Errorf("%w: %s already has %d open (at most %d per run); it is closed, retry when one of the others is done", errTooManyConnections, id, n, l.perIdentity)
	}
	if n := l.byNamespace[ns]; ns != "" && n >= l.perNamespace {
		return fmt.Errorf("%w: namespace %s already has %d open (at most %d per namespace); it is closed, retry when one of the others is done", errTooManyConnections, ns, n, l.perNamespace)
	}
	use.counted, use.identity, use.namespace = true, id, ns
	l.byIdentity[id]++
	if ns != "" {
		l.byNamespace[ns]++
	}
	return nil
}

// identityNamespace is the namespace an identity belongs to, "" for none.
func identityNamespace(id pki.Identity) string {
	if ns, _, _, ok := id.Runner(); ok {
		return ns
	}
	if ns, _, _, ok := id.RunnerClass(); ok {
		return ns
	}
	if ns, ok := id.API(); ok {
		return ns
	}
	return ""
}

// limitListener accepts at most n connections at once; more wait in the
// listen queue until one closes. golang.org/x/net/netutil.LimitListener
// does the same, but the main module links x/net only indirectly, and
// this one also keeps the open-connections gauge.
type limitListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	openConnections.Inc()
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() {
		openConnections.Dec()
		<-l.slots
	})}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when closed.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
