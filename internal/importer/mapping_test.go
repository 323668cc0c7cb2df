package importer

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// terraform is a Terraform object app/team from a Flux GitRepository,
// with the spec fields given.
func terraform(fields map[string]any) *unstructured.Unstructured {
	spec := map[string]any{
		"interval":  "10m",
		"sourceRef": map[string]any{"kind": "GitRepository", "name": "repo"},
	}
	for k, v := range fields {
		spec[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": TerraformAPIVersion, "kind": TerraformKind,
		"metadata": map[string]any{"name": "app", "namespace": "team"},
		"spec":     spec,
	}}
}

func reasonFor(r Result, field string) string {
	for _, u := range r.Unmapped {
		if u.Field == field {
			return u.Reason
		}
	}
	return ""
}

func varJSON(r Result, name string) string {
	return string(r.Stack.Spec.Vars[name].Raw)
}

type mappingCase struct {
	name   string
	fields map[string]any
	check  func(t *testing.T, r Result)
}

// unmapped expects field to be listed with a reason containing want.
func unmapped(field, want string) func(t *testing.T, r Result) {
	return func(t *testing.T, r Result) {
		t.Helper()
		if got := reasonFor(r, field); got == "" || !strings.Contains(got, want) {
			t.Errorf("%s: reason %q, want one containing %q (unmapped: %+v)", field, got, want, r.Unmapped)
		}
	}
}

func runMappingCases(t *testing.T, cases []mappingCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Convert(terraform(tc.fields), Options{})
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
}

func TestMapSourceApprovalAndSchedule(t *testing.T) {
	runMappingCases(t, []mappingCase{
		{"defaults", nil, func(t *testing.T, r Result) {
			s := r.Stack.Spec
			if s.Source.SourceRef == nil || s.Source.SourceRef.Kind != "GitRepository" || s.Source.SourceRef.Name != "repo" || s.Source.SourceRef.Namespace != "" {
				t.Errorf("source %+v", s.Source)
			}
			if s.Interval.Duration != 10*time.Minute || s.DriftDetection.Mode != terracev1.DriftDetectionEnabled || s.Workspace != "default" || s.ApprovePlan != "" {
				t.Errorf("spec %+v", s)
			}
			if r.StateSecret != "tfstate-default-app" || r.Stack.Name != "app" || r.Stack.Namespace != "team" || len(r.Unmapped) != 0 {
				t.Errorf("result %+v", r)
			}
		}},
		{"sourceRef in another namespace", map[string]any{"sourceRef": map[string]any{"kind": "OCIRepository", "name": "oci", "namespace": "flux-system"}}, func(t *testing.T, r Result) {
			if ref := r.Stack.Spec.Source.SourceRef; ref.Kind != "OCIRepository" || ref.Namespace != "flux-system" {
				t.Errorf("source %+v", ref)
			}
		}},
		{"approvePlan auto", map[string]any{"approvePlan": "auto"}, func(t *testing.T, r Result) {
			if r.Stack.Spec.ApprovePlan != "auto" {
				t.Errorf("approvePlan %q", r.Stack.Spec.ApprovePlan)
			}
		}},
		{"approvePlan disable is drift detection only", map[string]any{"approvePlan": "disable"}, func(t *testing.T, r Result) {
			if s := r.Stack.Spec; !s.PlanOnly || s.DriftDetection.Mode != terracev1.DriftDetectionWarn || s.ApprovePlan != "" {
				t.Errorf("spec %+v", s)
			}
		}},
		{"approvePlan disable wins over disableDriftDetection: false", map[string]any{"approvePlan": "disable", "disableDriftDetection": false}, func(t *testing.T, r Result) {
			if r.Stack.Spec.DriftDetection.Mode != terracev1.DriftDetectionWarn {
				t.Errorf("drift %+v", r.Stack.Spec.DriftDetection)
			}
		}},
		{"approvePlan of a tofu-controller plan id", map[string]any{"approvePlan": "plan-main-1a2b3c"}, unmapped("spec.approvePlan", "terrace approve")},
		{"approvePlan of the wrong type", map[string]any{"approvePlan": 5}, unmapped("spec.approvePlan", "invalid value: want a string")},
		{"disableDriftDetection", map[string]any{"disableDriftDetection": true}, func(t *testing.T, r Result) {
			if r.Stack.Spec.DriftDetection.Mode != terracev1.DriftDetectionDisabled {
				t.Errorf("drift %+v", r.Stack.Spec.DriftDetection)
			}
		}},
		{"intervals", map[string]any{"interval": "90s", "retryInterval": "20s", "maxRetryInterval": "30m"}, func(t *testing.T, r Result) {
			s := r.Stack.Spec
			if s.Interval.Duration != 90*time.Second || s.RetryInterval.Duration != 20*time.Second || s.MaxRetryInterval.Duration != 30*time.Minute {
				t.Errorf("intervals %v %v %v", s.Interval, s.RetryInterval, s.MaxRetryInterval)
			}
		}},
		{"a bad interval", map[string]any{"interval": "soon"}, unmapped("spec.interval", "invalid value")},
		{"a negative interval", map[string]any{"retryInterval": "-1s"}, unmapped("spec.retryInterval", "not positive")},
		{"static retries", map[string]any{"retryStrategy": "StaticInterval", "retryInterval": "45s", "maxRetryInterval": "1h"}, func(t *testing.T, r Result) {
			if s := r.Stack.Spec; s.RetryInterval.Duration != 45*time.Second || s.MaxRetryInterval.Duration != 45*time.Second {
				t.Errorf("retry %v max %v", s.RetryInterval, s.MaxRetryInterval)
			}
		}},
		{"static retries with tofu-controller's default interval", map[string]any{"retryStrategy": "StaticInterval"}, func(t *testing.T, r Result) {
			if s := r.Stack.Spec; s.RetryInterval.Duration != 15*time.Second || s.MaxRetryInterval.Duration != 15*time.Second {
				t.Errorf("retry %v max %v", s.RetryInterval, s.MaxRetryInterval)
			}
		}},
		{"exponential retries", map[string]any{"retryStrategy": "ExponentialBackoff"}, func(t *testing.T, r Result) {
			if r.Stack.Spec.MaxRetryInterval != nil || len(r.Unmapped) != 0 {
				t.Errorf("%+v", r)
			}
		}},
		{"an unknown retry strategy", map[string]any{"retryStrategy": "Fibonacci"}, unmapped("spec.retryStrategy", "unknown retry strategy")},
		{"path", map[string]any{"path": "./infra/prod/"}, func(t *testing.T, r Result) {
			if r.Stack.Spec.Path != "infra/prod" {
				t.Errorf("path %q", r.Stack.Spec.Path)
			}
		}},
		{"root path", map[string]any{"path": "./"}, func(t *testing.T, r Result) {
			if r.Stack.Spec.Path != "" {
				t.Errorf("path %q", r.Stack.Spec.Path)
			}
		}},
		{"a path leaving the source", map[string]any{"path": "../other"}, unmapped("spec.path", "leaves the source")},
		{"suspend is not copied", map[string]any{"suspend": true}, func(t *testing.T, r Result) {
			if !r.Suspended || r.Stack.Spec.Suspend {
				t.Errorf("suspended %v, Stack suspend %v", r.Suspended, r.Stack.Spec.Suspend)
			}
		}},
		{"planOnly", map[string]any{"planOnly": true}, func(t *testing.T, r Result) {
			if !r.Stack.Spec.PlanOnly {
				t.Error("planOnly not copied")
			}
		}},
		{"dependsOn", map[string]any{"dependsOn": []any{map[string]any{"name": "net"}, map[string]any{"name": "db", "namespace": "team"}, map[string]any{"name": "dns", "namespace": "infra"}}}, func(t *testing.T, r Result) {
			d := r.Stack.Spec.DependsOn
			if len(d) != 3 || d[0].Name != "net" || d[1].Namespace != "" || d[2].Namespace != "infra" {
				t.Errorf("dependsOn %+v", d)
			}
		}},
		{"a dependency without a name", map[string]any{"dependsOn": []any{map[string]any{"namespace": "x"}}}, unmapped("spec.dependsOn", "without a name")},
		{"an unknown field", map[string]any{"pushSpec": map[string]any{"branch": "x"}}, unmapped("spec.pushSpec", "not a field of tofu-controller's v1alpha2")},
	})
}

func TestKeepSuspend(t *testing.T) {
	r, err := Convert(terraform(map[string]any{"suspend": true}), Options{KeepSuspend: true})
	if err != nil || !r.Stack.Spec.Suspend {
		t.Fatalf("suspend not kept: %v %+v", err, r.Stack.Spec)
	}
}

func TestMapInputs(t *testing.T) {
	runMappingCases(t, []mappingCase{
		{"inline vars", map[string]any{"vars": []any{
			map[string]any{"name": "region", "value": "eu-west-1"},
			map[string]any{"name": "replicas", "value": 3},
			map[string]any{"name": "tags", "value": map[string]any{"team": "a"}},
		}}, func(t *testing.T, r Result) {
			if varJSON(r, "region") != `"eu-west-1"` || varJSON(r, "replicas") != `3` || varJSON(r, "tags") != `{"team":"a"}` {
				t.Errorf("vars %v", r.Stack.Spec.Vars)
			}
		}},
		{"a var from a Secret key of its name", map[string]any{"vars": []any{
			map[string]any{"name": "token", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "creds", "key": "token"}}},
			map[string]any{"name": "size", "valueFrom": map[string]any{"configMapKeyRef": map[string]any{"name": "cfg", "key": "size", "optional": true}}},
		}}, func(t *testing.T, r Result) {
			v := r.Stack.Spec.VarsFrom
			if len(v) != 2 || v[0].Kind != "Secret" || v[0].Name != "creds" || v[0].Keys[0] != "token" || v[1].Kind != "ConfigMap" || !v[1].Optional {
				t.Errorf("varsFrom %+v", v)
			}
		}},
		{"a var from a key of another name", map[string]any{"vars": []any{
			map[string]any{"name": "token", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "creds", "key": "api-token"}}},
		}}, unmapped("spec.vars[0].valueFrom", `add a key "token"`)},
		{"a var from a field", map[string]any{"vars": []any{
			map[string]any{"name": "ns", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "metadata.namespace"}}},
		}}, unmapped("spec.vars[0].valueFrom", "only secretKeyRef and configMapKeyRef")},
		{"a var without a name", map[string]any{"vars": []any{map[string]any{"value": 1}}}, unmapped("spec.vars[0]", "without a name")},
		{"vars of the wrong type", map[string]any{"vars": "region=eu"}, unmapped("spec.vars", "invalid value")},
		{"varsFrom", map[string]any{"varsFrom": []any{
			map[string]any{"kind": "Secret", "name": "creds", "varsKeys": []any{"a", "b"}},
			map[string]any{"kind": "ConfigMap", "name": "cfg", "optional": true},
		}}, func(t *testing.T, r Result) {
			v := r.Stack.Spec.VarsFrom
			if len(v) != 2 || strings.Join(v[0].Keys, ",") != "a,b" || v[1].Kind != "ConfigMap" || !v[1].Optional || v[1].Keys != nil {
				t.Errorf("varsFrom %+v", v)
			}
		}},
		{"varsFrom renaming a key", map[string]any{"varsFrom": []any{map[string]any{"kind": "Secret", "name": "creds", "varsKeys": []any{"a:alias"}}}}, unmapped("spec.varsFrom[0].varsKeys", `renaming "a:alias"`)},
		{"varsFrom of a bad kind", map[string]any{"varsFrom": []any{map[string]any{"kind": "Pod", "name": "x"}}}, unmapped("spec.varsFrom[0]", "kind must be Secret or ConfigMap")},
		{"values", map[string]any{"values": map[string]any{"a": 1}}, func(t *testing.T, r Result) {
			if varJSON(r, "values") != `{"a":1}` {
				t.Errorf("vars %v", r.Stack.Spec.Vars)
			}
		}},
		{"run options", map[string]any{
			"tfVarsFiles":  []any{"prod.tfvars"},
			"fileMappings": []any{map[string]any{"secretRef": map[string]any{"name": "kc", "key": "config"}, "location": "home", "path": ".kube/config"}},
			"targets":      []any{"aws_s3_bucket.logs"},
			"parallelism":  int64(4),
		}, func(t *testing.T, r Result) {
			raw, _ := json.Marshal(r.RunOptions)
			want := `{"fileMappings":[{"location":"home","path":".kube/config","secretRef":{"key":"config","name":"kc"}}],"parallelism":4,"targets":["aws_s3_bucket.logs"],"varsFiles":["prod.tfvars"]}`
			if string(raw) != want {
				t.Errorf("run options %s, want %s", raw, want)
			}
		}},
		{"workspace", map[string]any{"workspace": "prod"}, func(t *testing.T, r Result) {
			if r.Stack.Spec.Workspace != "prod" || r.StateSecret != "tfstate-prod-app" {
				t.Errorf("workspace %q, state %q", r.Stack.Spec.Workspace, r.StateSecret)
			}
		}},
	})
}
