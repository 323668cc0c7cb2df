// Package pkitest has the test helpers that internal/pki's tests and those
// of the packages built on it share: one real TLS connection and a
// settable clock. It imports nothing of Terrace's, so internal/pki's own
// tests can use it.
package pkitest

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Handshake is what each side of one real TLS connection saw.
type Handshake struct {
	ServerErr, ClientErr     error
	ServerState, ClientState tls.ConnectionState
}

// OK says both sides completed the handshake and exchanged data.
func (h Handshake) OK() bool { return h.ServerErr == nil && h.ClientErr == nil }

// Connect runs one TLS connection over a loopback listener: the server
// completes the handshake and writes a line, the client reads it. In TLS
// 1.3 a client learns that the server refused its certificate only when it
// reads, so both sides exchange data before the result counts.
func Connect(t testing.TB, server, client *tls.Config) Handshake {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("failed to listen: %v", err)
	}
	defer ln.Close()

	type serverSide struct {
		err   error
		state tls.ConnectionState
	}
	done := make(chan serverSide, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			done <- serverSide{err: err}
			return
		}
		conn := tls.Server(raw, server)
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := conn.Handshake(); err != nil {
			done <- serverSide{err: err}
			return
		}
		_, err = conn.Write([]byte("ok\n"))
		done <- serverSide{err: err, state: conn.ConnectionState()}
	}()

	var res Handshake
	raw, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatalf("failed to dial: %v", err)
	}
	conn := tls.Client(raw, client)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	res.ClientErr = conn.Handshake()
	if res.ClientErr == nil {
		buf := make([]byte, 3)
		if _, err := io.ReadFull(conn, buf); err != nil {
			res.ClientErr = err
		} else {
			res.ClientState = conn.ConnectionState()
		}
	}
	_ = conn.Close()
	s := <-done
	res.ServerErr, res.ServerState = s.err, s.state
	return res
}

// Clock is a settable clock shared by an Authority and TLS configs.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads t until advanced.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
