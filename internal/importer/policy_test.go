package importer

import (
	"bytes"
	"strings"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

const runnerImage = "ghcr.io/terrace-dev/terrace:v1"

// policyOf checks Stacks as the controller does, against a floor config's policy.
func policyOf(spec *terracev1.RunnerPolicy, image string) PolicyCheck {
	pol, _ := runnerpolicy.Resolve(runnerpolicy.Layer{Source: "terrace-system/default", Spec: spec}, nil, runnerImage)
	return func(s *terracev1.Stack) error {
		pod := runnerpolicy.Pod{Template: s.Spec.Runner, Image: image, ImageField: "spec.runner.image of TerraceConfig terrace-system/default",
			ServiceAccountName: "default", ServiceAccountField: "spec.serviceAccountName"}
		if s.Spec.ServiceAccountName != "" {
			pod.ServiceAccountName = s.Spec.ServiceAccountName
		}
		if s.Spec.Backend != nil {
			pod.OwnBackend = s.Spec.Backend.Type
		}
		return pol.Check(pod)
	}
}

func TestApplyPolicyDropsWhatThePolicyRefuses(t *testing.T) {
	r, err := Convert(terraform(map[string]any{
		"serviceAccountName": "terrace-controller",
		"backendConfig":      map[string]any{"customConfiguration": "backend \"pg\" {\n  schema_name = \"app\"\n}\n"},
		"runnerPodTemplate": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"team": "a"}},
			"spec": map[string]any{
				"env":          []any{map[string]any{"name": "A", "value": "1"}},
				"tolerations":  []any{map[string]any{"operator": "Exists"}},
				"volumes":      []any{map[string]any{"name": "host", "hostPath": map[string]any{"path": "/"}}},
				"volumeMounts": []any{map[string]any{"name": "host", "mountPath": "/host"}},
			},
		},
	}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	no := false
	if err := r.ApplyPolicy(policyOf(&terracev1.RunnerPolicy{AllowEnv: &no, AllowPlacement: &no, AllowOwnBackend: &no}, runnerImage)); err != nil {
		t.Fatal(err)
	}
	rt := r.Stack.Spec.Runner
	if rt.Env != nil || rt.Tolerations != nil || rt.Volumes != nil || rt.VolumeMounts != nil || rt.Labels["team"] != "a" {
		t.Errorf("runner after the policy: %+v", rt)
	}
	if r.Stack.Spec.ServiceAccountName != "" || r.Stack.Spec.Backend != nil {
		t.Errorf("spec after the policy: %+v", r.Stack.Spec)
	}
	for field, want := range map[string]string{
		"spec.runnerPodTemplate.spec.env":                 "allowEnv: false",
		"spec.runnerPodTemplate.spec.tolerations":         "allowPlacement: false",
		"spec.runnerPodTemplate.spec.volumes[0].hostPath": "never allowed",
		"spec.serviceAccountName":                         "Terrace's own",
		"spec.backendConfig.customConfiguration":          "allowOwnBackend: false",
	} {
		if got := reasonFor(r, field); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q (%s)", field, got, want, listReasons(r))
		}
	}
}

func TestApplyPolicyKeepsWhatItAllows(t *testing.T) {
	r, err := Convert(terraform(map[string]any{"runnerPodTemplate": map[string]any{"spec": map[string]any{"env": []any{map[string]any{"name": "A", "value": "1"}}}}}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ApplyPolicy(policyOf(nil, runnerImage)); err != nil || len(r.Stack.Spec.Runner.Env) != 1 || len(r.Unmapped) != 0 {
		t.Fatalf("err %v runner %+v unmapped %+v", err, r.Stack.Spec.Runner, r.Unmapped)
	}
}

// A config whose own runner image its policy refuses is not the Stack's
// doing: the import stops and says so.
func TestApplyPolicyRefusesAConfigTheFloorRefuses(t *testing.T) {
	r, err := Convert(terraform(nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.ApplyPolicy(policyOf(nil, "evil/image"))
	if err == nil || !strings.Contains(err.Error(), "whatever the Stack says") {
		t.Fatalf("err = %v", err)
	}
}

func TestReadAndWriteYAML(t *testing.T) {
	in := `
apiVersion: infra.contrib.fluxcd.io/v1alpha2
kind: Terraform
metadata: {name: a, namespace: team}
spec:
  interval: 5m
  approvePlan: auto
  sourceRef: {kind: GitRepository, name: repo}
  webhooks: [{stage: post-planning, url: "http://x"}]
  targets: [x.y]
---
apiVersion: v1
kind: List
items:
- apiVersion: infra.contrib.fluxcd.io/v1alpha2
  kind: Terraform
  metadata: {name: b, namespace: team}
  spec: {interval: 1m, suspend: true, sourceRef: {kind: Bucket, name: bkt}}
`
	objs, err := ReadObjects(strings.NewReader(in))
	if err != nil || len(objs) != 2 {
		t.Fatalf("read %d objects: %v", len(objs), err)
	}
	var results []Result
	for _, o := range objs {
		r, err := Convert(o, Options{})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	var out, report bytes.Buffer
	if err := WriteYAML(&out, results); err != nil {
		t.Fatal(err)
	}
	WriteReport(&report, results)
	text := out.String()
	for _, want := range []string{
		"# Imported from Terraform team/a.",
		"# State: tofu-controller Secret tfstate-default-a",
		"# The Terraform object is not suspended",
		"# NOT MAPPED spec.webhooks: post-planning webhooks",
		"apiVersion: terrace.dev/v1alpha1\nkind: Stack\n",
		"  targets:\n  - x.y\n",
		"---\n# Imported from Terraform team/b.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "creationTimestamp") || strings.Contains(text, "status:") || strings.Count(text, "not suspended") != 1 {
		t.Errorf("output:\n%s", text)
	}
	if r := report.String(); !strings.Contains(r, "team/a: 1 field(s) not mapped\n  spec.webhooks:") || !strings.Contains(r, "team/b: every field mapped") {
		t.Errorf("report:\n%s", r)
	}
}

func TestReadObjectsRefusesBadInput(t *testing.T) {
	for name, in := range map[string]string{
		"not YAML":              "spec: [unclosed\n",
		"not an object":         "- a\n- b\n",
		"a List of non-objects": "apiVersion: v1\nkind: List\nitems: [5]\n",
	} {
		if _, err := ReadObjects(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
