package devnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probeTarget is what a probe needs to know about the running container.
type probeTarget struct {
	podIP     string
	container *corev1.Container
	// exec runs an exec probe's command; nil when exec probes cannot run.
	exec func(ctx context.Context, command []string) *exec.Cmd
}

// runProbe performs one probe with the probe's timeout and reports success
// and, on failure, why.
func runProbe(ctx context.Context, p *corev1.Probe, t probeTarget) (bool, string) {
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	switch {
	case p.HTTPGet != nil:
		err = probeHTTP(ctx, p.HTTPGet, t)
	case p.TCPSocket != nil:
		err = probeTCP(ctx, p.TCPSocket, t)
	case p.GRPC != nil:
		err = probeGRPC(ctx, p.GRPC, t)
	case p.Exec != nil:
		err = probeExec(ctx, p.Exec, t)
	default:
		err = errors.New("probe has no handler")
	}
	if err != nil {
		return false, err.Error()
	}
	return true, ""
}

// resolvePort turns a number or a named container port into a port number.
func resolvePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("container %q has no port named %q", c.Name, port.StrVal)
}

func probeHost(host string, t probeTarget) string {
	if host != "" {
		return host
	}
	return t.podIP
}

func probeHTTP(ctx context.Context, h *corev1.HTTPGetAction, t probeTarget) error {
	port, err := resolvePort(h.Port, t.container)
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := h.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(probeHost(h.Host, t), strconv.Itoa(port))}
	u, err = u.Parse(path)
	if err != nil {
		return fmt.Errorf("invalid probe path %q: %w", h.Path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/devnode")
	req.Header.Set("Accept", "*/*")
	for _, hdr := range h.HTTPHeaders {
		if strings.EqualFold(hdr.Name, "Host") {
			req.Host = hdr.Value
			continue
		}
		req.Header.Set(hdr.Name, hdr.Value)
	}
	// The kubelet does not verify probe certificates either.
	client := &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // probes check liveness, not identity
			DisableKeepAlives: true,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("too many redirects")
			}
			return nil
		},
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("HTTP probe failed: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

func probeTCP(ctx context.Context, s *corev1.TCPSocketAction, t probeTarget) error {
	port, err := resolvePort(s.Port, t.container)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(probeHost(s.Host, t), strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("TCP probe failed: %w", err)
	}
	return conn.Close()
}

func probeGRPC(ctx context.Context, g *corev1.GRPCAction, t probeTarget) error {
	conn, err := grpc.NewClient(net.JoinHostPort(t.podIP, strconv.Itoa(int(g.Port))), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("gRPC probe failed: %w", err)
	}
	defer func() { _ = conn.Close() }()
	service := ""
	if g.Service != nil {
		service = *g.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("gRPC probe failed: %w", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("service unhealthy (responded with %q)", resp.GetStatus())
	}
	return nil
}

func probeExec(ctx context.Context, e *corev1.ExecAction, t probeTarget) error {
	if t.exec == nil || len(e.Command) == 0 {
		return errors.New("exec probe cannot run")
	}
	cmd := t.exec(ctx, e.Command)
	if cmd == nil {
		return fmt.Errorf("exec probe command %q is not the terrace binary", e.Command[0])
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("exec probe failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// probeKind says what a probe's failure does.
type probeKind int

const (
	readinessProbe probeKind = iota
	livenessProbe
	startupProbe
)

func (k probeKind) String() string {
	return [...]string{"readiness", "liveness", "startup"}[k]
}

// Until a readiness probe first passes, it is retried after firstRetry,
// doubling up to its period: a container is not ready before that pass
// anyway, and a process that listens a few milliseconds after it started
// (the runner) is then seen ready at once rather than a period later.
// Startup and liveness probes keep their period, which bounds how soon
// their failures kill the container.
const firstRetry = 10 * time.Millisecond

// probeLoop runs p every period after its initial delay and reports each
// change of its outcome, after the success and failure thresholds, through
// report. It returns when ctx ends.
func probeLoop(ctx context.Context, kind probeKind, p *corev1.Probe, t probeTarget, report func(ok bool, message string)) {
	period := time.Duration(p.PeriodSeconds) * time.Second
	if period <= 0 {
		period = 10 * time.Second
	}
	successThreshold, failureThreshold := int(p.SuccessThreshold), int(p.FailureThreshold)
	if successThreshold <= 0 {
		successThreshold = 1
	}
	if failureThreshold <= 0 {
		failureThreshold = 3
	}
	timer := time.NewTimer(time.Duration(p.InitialDelaySeconds) * time.Second)
	defer timer.Stop()
	successes, failures := 0, 0
	state := -1 // unknown
	retry := firstRetry
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		ok, msg := runProbe(ctx, p, t)
		if ctx.Err() != nil {
			return
		}
		if ok {
			successes, failures = successes+1, 0
			if successes >= successThreshold && state != 1 {
				state = 1
				report(true, "")
			}
		} else {
			successes, failures = 0, failures+1
			if kind == readinessProbe && state == -1 {
				// Not ready yet in any case: look again soon, and do not
				// report the failures of a process still starting.
				timer.Reset(min(retry, period))
				retry *= 2
				continue
			}
			if failures >= failureThreshold && state != 0 {
				state = 0
				report(false, fmt.Sprintf("%s probe failed: %s", kind, msg))
			}
		}
		timer.Reset(period)
	}
}
