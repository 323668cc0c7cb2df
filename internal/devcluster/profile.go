package devcluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/rest"
)

// MaxAPIServerProfile is the longest profile APIServerProfile records: a
// profile is one request, and kube-apiserver ends requests after its
// --request-timeout (60 s by default).
const MaxAPIServerProfile = 55 * time.Second

// APIServerProfile records kube-apiserver's CPU for d (at most
// MaxAPIServerProfile) into path, in pprof's format (`go tool pprof path`).
// The cluster must have started with Options.Profiling; the API server
// serves /debug/pprof only to admins. It returns when the profile is
// written, about d after the call.
func (c *Cluster) APIServerProfile(ctx context.Context, d time.Duration, path string) error {
	d = min(d, MaxAPIServerProfile)
	client, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return fmt.Errorf("failed to build admin HTTP client: %w", err)
	}
	seconds := max(1, int(d.Round(time.Second)/time.Second))
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", c.APIServerURL, seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("failed to profile kube-apiserver: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("failed to profile kube-apiserver: %s: %s (was the cluster started with Profiling?)", resp.Status, body)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("failed to write the profile: %w", err)
	}
	return f.Close()
}
