// Package monitoring_test checks the PrometheusRule and Grafana dashboard
// shipped in config/monitoring against the metrics the controller exports.
//
// Expressions are parsed with github.com/VictoriaMetrics/metricsql, a PromQL
// parser with four small dependencies: the Prometheus module's own rulefmt
// and promql/parser would bring its storage engine and dozens of modules
// into Terrace's go.mod. metricsql accepts a superset of PromQL, so the
// expressions here stay within PromQL by review.
package monitoring_test

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/VictoriaMetrics/metricsql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	// Every package that registers terrace_* metrics with the controller's registry.
	_ "github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	_ "github.com/terrace-dev/terrace/internal/controller/stack"
	_ "github.com/terrace-dev/terrace/internal/pki/casecret"
	_ "github.com/terrace-dev/terrace/internal/state/httpbackend"
)

type prometheusRule struct {
	APIVersion string                       `json:"apiVersion"`
	Kind       string                       `json:"kind"`
	Metadata   map[string]any               `json:"metadata"`
	Spec       struct{ Groups []ruleGroup } `json:"spec"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// exported reports whether the controller's registry holds a metric family
// called name: registering a probe of that name fails exactly then (a
// Vec without series is missing from Gather, so Gather cannot tell).
func exported(t *testing.T, name string) bool {
	t.Helper()
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported(t, base) {
			return true
		}
	}
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "probe"})
	err := metrics.Registry.Register(probe)
	if err == nil {
		metrics.Registry.Unregister(probe)
		return false
	}
	var already prometheus.AlreadyRegisteredError
	return errors.As(err, &already) || strings.Contains(err.Error(), "same fully-qualified name")
}

// metricNames parses a PromQL expression and returns the metrics it reads.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	parsed, err := metricsql.Parse(expr)
	if err != nil {
		t.Fatalf("expression does not parse: %v\n%s", err, expr)
	}
	var names []string
	metricsql.VisitAll(parsed, func(e metricsql.Expr) {
		me, ok := e.(*metricsql.MetricExpr)
		if !ok {
			return
		}
		for _, lfs := range me.LabelFilterss {
			for _, lf := range lfs {
				if lf.Label == "__name__" && !lf.IsRegexp && !lf.IsNegative && !slices.Contains(names, lf.Value) {
					names = append(names, lf.Value)
				}
			}
		}
	})
	return names
}

func checkExpression(t *testing.T, where, expr string) {
	t.Helper()
	names := metricNames(t, expr)
	if len(names) == 0 {
		t.Errorf("%s: the expression reads no metric: %s", where, expr)
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "terrace_") || !exported(t, n) {
			t.Errorf("%s: %s is not a metric the controller exports", where, n)
		}
	}
}

// Prometheus's alert template functions, for parsing annotations.
var alertTemplateFuncs = template.FuncMap{
	"humanize": fmtAny, "humanize1024": fmtAny, "humanizeDuration": fmtAny, "humanizePercentage": fmtAny, "humanizeTimestamp": fmtAny,
}

func fmtAny(any) string { return "" }

// alertTemplateVars are the variables Prometheus defines before an annotation.
const alertTemplateVars = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

func TestPrometheusRuleNamesOnlyExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := yaml.UnmarshalStrict(data, &pr); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || len(pr.Spec.Groups) == 0 {
		t.Fatalf("not a PrometheusRule with groups: %s %s", pr.APIVersion, pr.Kind)
	}
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Alert
			alerts = append(alerts, r.Alert)
			checkExpression(t, where, r.Expr)
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", where, r.For, err)
				}
			}
			if !slices.Contains([]string{"info", "warning", "critical"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want info, warning or critical", where, r.Labels["severity"])
			}
			for _, key := range []string{"summary", "description"} {
				text, ok := r.Annotations[key]
				if !ok {
					t.Errorf("%s: no %s annotation", where, key)
				}
				if _, err := template.New(key).Funcs(alertTemplateFuncs).Parse(alertTemplateVars + text); err != nil {
					t.Errorf("%s: annotation %s: %v", where, key, err)
				}
			}
		}
	}
	// The alerts a user sets up on day one (issue 17).
	for _, want := range []string{"TerraceStackNotReady", "TerraceDriftDetected", "TerraceRunsFailing", "TerraceStateServerErrors", "TerraceCertificateNearExpiry"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}
}

func TestGrafanaDashboardNamesOnlyExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q has uid %q and %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	seen := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			checkExpression(t, "panel "+p.Title, target.Expr)
			for _, n := range metricNames(t, target.Expr) {
				seen[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	// Every metric the controller exports is on the dashboard.
	for _, n := range []string{"terrace_stack_ready", "terrace_runs_total", "terrace_run_duration_seconds", "terrace_runner_start_duration_seconds",
		"terrace_drift_detected_total", "terrace_state_requests_total", "terrace_state_request_duration_seconds",
		"terrace_artifact_requests_total", "terrace_artifact_bytes_served_total", "terrace_ca_expiry_timestamp_seconds"} {
		if !seen[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}

// The probe itself must be able to fail.
func TestExportedTellsMetricsApart(t *testing.T) {
	if !exported(t, "terrace_runs_total") || !exported(t, "terrace_run_duration_seconds_bucket") {
		t.Fatal("exported misses a registered metric")
	}
	if exported(t, "terrace_no_such_metric_total") {
		t.Fatal("exported accepts a metric nobody registers")
	}
}
