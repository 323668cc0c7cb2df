package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// metricValue reads a counter or gauge the in-process controller exports
// (the registry its /metrics endpoint serves) for the series with labels.
func metricValue(t testing.TB, name string, labels map[string]string) (float64, error) {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue(), nil
				case m.Gauge != nil:
					return m.Gauge.GetValue(), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no series %s%v", name, labels)
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			found++
		}
	}
	return found == len(want)
}

// controllerMetrics reads the metrics of the controller wherever it runs:
// its pod, its process, or this process.
func controllerMetrics() (map[string]float64, error) {
	switch {
	case benchDeployment != nil:
		return benchDeployment.scrape()
	case benchController != nil:
		return httpMetrics(http.DefaultClient, benchController.metrics, "")
	}
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return nil, err
	}
	var text bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&text, f); err != nil {
			return nil, err
		}
	}
	return parseMetrics(&text)
}

// httpMetrics reads a Prometheus endpoint, with a bearer token if given.
func httpMetrics(c *http.Client, url, token string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus's text format: series → value.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// sumMetric adds up every series of a metric whose labels include all of
// labels (`name="value"` pairs).
func sumMetric(samples map[string]float64, name string, labels ...string) float64 {
	var total float64
	for series, v := range samples {
		if !seriesOf(series, name) {
			continue
		}
		matched := true
		for _, l := range labels {
			matched = matched && strings.Contains(series, l)
		}
		if matched {
			total += v
		}
	}
	return total
}

// seriesOf says series ("name{labels}" or "name") is one of metric name's.
func seriesOf(series, name string) bool {
	return series == name || strings.HasPrefix(series, name+"{")
}

// hasMetric says samples hold a series of metric name.
func hasMetric(samples map[string]float64, name string) bool {
	for series := range samples {
		if seriesOf(series, name) {
			return true
		}
	}
	return false
}
