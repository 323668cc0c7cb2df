package devcluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// getter probes a health endpoint: nil when healthy.
type getter func(ctx context.Context) error

func plainGetter(url string) getter {
	return clientGetter(&http.Client{Timeout: 2 * time.Second}, url)
}

func clientGetter(client *http.Client, url string) getter {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %s", url, resp.Status)
		}
		return nil
	}
}

func waitReady(ctx context.Context, p *process, probe getter) error {
	var last error
	err := pollUntil(ctx, p, func(ctx context.Context) (bool, error) {
		last = probe(ctx)
		return last == nil, nil
	}, p.name+" to become ready")
	if err != nil && last != nil && !p.exited() {
		return fmt.Errorf("%w (last probe: %v); last log lines:\n%s", err, last, p.lastLogLines(25))
	}
	return err
}

// pollUntil runs cond every 100 ms until it is true, fails, the process
// exits or ctx ends.
func pollUntil(ctx context.Context, p *process, cond func(context.Context) (bool, error), what string) error {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("failed while waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-p.done:
			return p.crashError()
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s: %w", what, ctx.Err())
		case <-ticker.C:
		}
	}
}

// FreePorts asks the kernel for n distinct free ports on ip.
func FreePorts(ip string, n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, fmt.Errorf("failed to find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
