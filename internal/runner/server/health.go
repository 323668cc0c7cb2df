package server

import (
	"github.com/terrace-dev/terrace/internal/runner"

	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"text/template"
	"time"

	"google.golang.org/grpc/codes"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Health check defaults and bounds.
const (
	defaultHealthTimeout = 30 * time.Second
	maxHealthTimeout     = 10 * time.Minute
	healthRetryEvery     = time.Second
	healthAttemptTimeout = 5 * time.Second
	healthBodyLimit      = 64 << 10
	maxHealthChecks      = 32
)

// CheckHealth runs the checks from the pod's network position, with the
// outputs the runner reads from its own state.
func (s *Server) CheckHealth(ctx context.Context, req *runnerv1.CheckHealthRequest) (*runnerv1.CheckHealthResponse, error) {
	if len(req.GetChecks()) > maxHealthChecks {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("at most %d health checks", maxHealthChecks))
	}
	release, err := s.acquire("check-health")
	if err != nil {
		return nil, err
	}
	defer release()
	outs, err := s.exec.Outputs(ctx)
	if err != nil {
		return nil, s.toStatus(err)
	}
	values := map[string]any{}
	for name, o := range outs {
		var v any
		if err := json.Unmarshal(o.Value, &v); err == nil {
			values[name] = v
		}
	}
	data := map[string]any{"outputs": values}
	resp := &runnerv1.CheckHealthResponse{}
	for _, c := range req.GetChecks() {
		res := s.runCheck(ctx, c, data)
		res.Message = s.exec.Redactor().String(res.Message)
		res.Target = s.exec.Redactor().String(res.Target)
		resp.Results = append(resp.Results, res)
	}
	return resp, nil
}

// runCheck tries one check once a second until it passes or times out.
func (s *Server) runCheck(ctx context.Context, c *runnerv1.HealthCheck, data map[string]any) *runnerv1.HealthCheckResult {
	res := &runnerv1.HealthCheckResult{Name: c.GetName()}
	target, err := renderTarget(c.GetTarget(), data)
	if err != nil {
		res.Message = err.Error()
		return res
	}
	res.Target = target
	var bodyMatch *regexp.Regexp
	if expr := c.GetBodyMatch(); expr != "" {
		if bodyMatch, err = regexp.Compile(expr); err != nil {
			res.Message = fmt.Sprintf("bodyMatch is not a valid regular expression: %v", err)
			return res
		}
	}
	timeout := time.Duration(c.GetTimeoutMs()) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultHealthTimeout
	}
	timeout = min(timeout, maxHealthTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		res.Attempts++
		attempt, cancelAttempt := context.WithTimeout(ctx, healthAttemptTimeout)
		switch c.GetType() {
		case runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP:
			err = checkHTTP(attempt, target, int(c.GetExpectedStatus()), bodyMatch)
		case runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP:
			err = checkTCP(attempt, target)
		default:
			err = fmt.Errorf("unknown check type %v", c.GetType())
			cancelAttempt()
			res.Message = err.Error()
			return res
		}
		cancelAttempt()
		if err == nil {
			res.Passed, res.Message = true, fmt.Sprintf("passed after %d attempt(s)", res.Attempts)
			return res
		}
		res.Message = err.Error()
		select {
		case <-ctx.Done():
			res.Message = fmt.Sprintf("%s (gave up after %d attempt(s) in %s)", res.Message, res.Attempts, timeout)
			return res
		case <-time.After(healthRetryEvery):
		}
	}
}

// renderTarget executes a check's address template over the outputs; a
// missing output is an error, not an empty string.
func renderTarget(text string, data map[string]any) (string, error) {
	tmpl, err := template.New("target").Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("the address template does not parse: %v", err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, data); err != nil {
		return "", fmt.Errorf("the address template cannot be filled from the outputs: %v", err)
	}
	return strings.TrimSpace(b.String()), nil
}

// checkHTTP GETs url once: the status must be the expected one (200 when
// 0) and the body, when bodyMatch is set, must match it. Errors never
// quote the body.
func checkHTTP(ctx context.Context, url string, expected int, bodyMatch *regexp.Regexp) error {
	if expected == 0 {
		expected = http.StatusOK
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("invalid url: %v", err)
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return fmt.Errorf("url must be http or https, not %q", req.URL.Scheme)
	}
	client := &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}},
		// A redirect is an answer of its own: the expected status decides.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET failed: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, healthBodyLimit))
	if err != nil {
		return fmt.Errorf("failed to read the answer: %v", err)
	}
	if resp.StatusCode != expected {
		return fmt.Errorf("GET answered %d, expected %d", resp.StatusCode, expected)
	}
	if bodyMatch != nil && !bodyMatch.Match(bytes.ToValidUTF8(body, nil)) {
		return fmt.Errorf("GET answered %d but the body does not match %q", resp.StatusCode, bodyMatch.String())
	}
	return nil
}

// checkTCP opens and closes one connection to address.
func checkTCP(ctx context.Context, address string) error {
	if _, _, err := net.SplitHostPort(address); err != nil {
		return fmt.Errorf("address must be host:port: %v", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return fmt.Errorf("connect failed: %v", err)
	}
	return conn.Close()
}
