package importer

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func TestMapOutputsRunnerAndState(t *testing.T) {
	runMappingCases(t, []mappingCase{
		{"outputs Secret", map[string]any{"writeOutputsToSecret": map[string]any{"name": "app-out", "outputs": []any{"url", "id:alias"}, "labels": map[string]any{"a": "b"}}}, func(t *testing.T, r Result) {
			o := r.Stack.Spec.WriteOutputsToSecret
			if o == nil || o.Name != "app-out" || strings.Join(o.Outputs, ",") != "url" || o.Labels["a"] != "b" {
				t.Errorf("outputs %+v", o)
			}
			unmapped("spec.writeOutputsToSecret.outputs", `renaming output "id:alias"`)(t, r)
		}},
		{"outputs Secret without a name", map[string]any{"writeOutputsToSecret": map[string]any{"outputs": []any{"url"}}}, unmapped("spec.writeOutputsToSecret", "has no name")},
		{"runner pod template", map[string]any{"runnerPodTemplate": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"team": "a"}, "annotations": map[string]any{"x": "y"}},
			"spec": map[string]any{
				"env":                   []any{map[string]any{"name": "AWS_REGION", "value": "eu-west-1"}},
				"nodeSelector":          map[string]any{"pool": "infra"},
				"image":                 "ghcr.io/flux-iac/tf-runner:v0.16.5",
				"hostAliases":           []any{map[string]any{"ip": "10.0.0.1", "hostnames": []any{"git"}}},
				"shareProcessNamespace": true,
			},
		}}, func(t *testing.T, r Result) {
			rt := r.Stack.Spec.Runner
			if rt == nil || rt.Labels["team"] != "a" || rt.Annotations["x"] != "y" || rt.Env[0].Name != "AWS_REGION" || rt.NodeSelector["pool"] != "infra" || rt.Image != "" {
				t.Errorf("runner %+v", rt)
			}
			unmapped("spec.runnerPodTemplate.spec.image", "tf-runner image")(t, r)
			unmapped("spec.runnerPodTemplate.spec.hostAliases", "host aliases")(t, r)
			unmapped("spec.runnerPodTemplate.spec.shareProcessNamespace", "not a field")(t, r)
		}},
		{"serviceAccountName and deletion", map[string]any{"serviceAccountName": "tf-runner", "destroyResourcesOnDeletion": true}, func(t *testing.T, r Result) {
			if s := r.Stack.Spec; s.ServiceAccountName != "tf-runner" || !s.DestroyOnDelete {
				t.Errorf("spec %+v", s)
			}
		}},
		{"storeReadablePlan", map[string]any{"storeReadablePlan": "human"}, func(t *testing.T, r Result) {
			if r.Stack.Spec.StoreReadablePlan != terracev1.ReadablePlanHuman {
				t.Errorf("storeReadablePlan %q", r.Stack.Spec.StoreReadablePlan)
			}
		}},
		{"a bad storeReadablePlan", map[string]any{"storeReadablePlan": "pdf"}, unmapped("spec.storeReadablePlan", `"pdf" is not none, json or human`)},
		{"health checks", map[string]any{"healthChecks": []any{
			map[string]any{"name": "web", "type": "http", "url": "https://{{.host}}/healthz", "timeout": "10s"},
			map[string]any{"name": "db", "type": "tcp", "address": "{{ .db_host }}:5432"},
			map[string]any{"name": "odd", "type": "icmp"},
		}}, func(t *testing.T, r Result) {
			hc, _ := r.RunOptions["healthChecks"].([]any)
			if len(hc) != 2 || hc[0].(map[string]any)["url"] != "https://{{ .outputs.host }}/healthz" || hc[1].(map[string]any)["address"] != "{{ .outputs.db_host }}:5432" {
				t.Errorf("health checks %+v", hc)
			}
			unmapped("spec.healthChecks[2]", `"icmp"`)(t, r)
		}},
		{"secretSuffix", map[string]any{"backendConfig": map[string]any{"secretSuffix": "legacy", "inClusterConfig": true, "labels": map[string]any{"a": "b"}}}, func(t *testing.T, r Result) {
			if r.StateSecret != "tfstate-default-legacy" || len(r.Unmapped) != 0 {
				t.Errorf("state %q unmapped %+v", r.StateSecret, r.Unmapped)
			}
		}},
		{"no backend", map[string]any{"backendConfig": map[string]any{"disable": true}}, func(t *testing.T, r Result) {
			if r.StateSecret != "" || r.Stack.Spec.Backend != nil {
				t.Errorf("state %q backend %+v", r.StateSecret, r.Stack.Spec.Backend)
			}
			unmapped("spec.backendConfig.disable", "none to adopt")(t, r)
		}},
		{"state in another cluster", map[string]any{"backendConfig": map[string]any{"configPath": "/kube/other"}}, unmapped("spec.backendConfig.configPath", "/kube/other")},
		{"a custom backend", map[string]any{"backendConfig": map[string]any{"customConfiguration": `
backend "s3" {
  bucket  = "tf-state"
  key     = "app/terraform.tfstate"
  encrypt = true
  max_retries = 5
  assume_role {
    role_arn = "arn:aws:iam::1:role/x"
  }
  profile = var.profile
}
`}}, func(t *testing.T, r Result) {
			b := r.Stack.Spec.Backend
			if b == nil || b.Type != "s3" || string(b.Config["bucket"].Raw) != `"tf-state"` || string(b.Config["encrypt"].Raw) != "true" || string(b.Config["max_retries"].Raw) != "5" {
				t.Fatalf("backend %+v", b)
			}
			if _, ok := b.Config["profile"]; ok || r.StateSecret != "" {
				t.Errorf("profile kept or state to adopt: %+v %q", b.Config, r.StateSecret)
			}
			if l := listReasons(r); !strings.Contains(l, "nested block assume_role") || !strings.Contains(l, "attribute profile is not a literal value") {
				t.Errorf("unmapped: %s", listReasons(r))
			}
		}},
		{"backend settings from Secrets", map[string]any{
			"backendConfig": map[string]any{"customConfiguration": "backend \"pg\" {\n  conn_str = \"postgres://old\"\n  schema_name = \"app\"\n}\n"},
			"backendConfigsFrom": []any{
				map[string]any{"kind": "Secret", "name": "pg-creds", "keys": []any{"conn_str", "sslmode"}, "optional": true},
				map[string]any{"kind": "ConfigMap", "name": "pg-settings", "keys": []any{"schema_name"}},
				map[string]any{"kind": "Secret", "name": "all-keys"},
				map[string]any{"kind": "Secret", "name": "again", "keys": []any{"conn_str"}},
			},
		}, func(t *testing.T, r Result) {
			b := r.Stack.Spec.Backend
			if b == nil || len(b.Credentials) != 1 || b.Credentials[0] != (terracev1.BackendCredential{Env: "PG_CONN_STR", SecretKeyRef: terracev1.SecretKeyReference{Name: "pg-creds", Key: "conn_str"}}) {
				t.Fatalf("credentials %+v", b)
			}
			// -backend-config overrode the block's own conn_str: the literal goes.
			if _, ok := b.Config["conn_str"]; ok || string(b.Config["schema_name"].Raw) != `"app"` {
				t.Errorf("config %+v", b.Config)
			}
			unmapped("spec.backendConfigsFrom[0].keys", `backend pg reads no environment variable for "sslmode"`)(t, r)
			unmapped("spec.backendConfigsFrom[0].optional", "required")(t, r)
			unmapped("spec.backendConfigsFrom[1]", "ConfigMap pg-settings: only Secrets become credentials")(t, r)
			unmapped("spec.backendConfigsFrom[2]", "no keys listed")(t, r)
			unmapped("spec.backendConfigsFrom[3].keys", "PG_CONN_STR is already set")(t, r)
		}},
		{"backend settings from Secrets for the kubernetes backend", map[string]any{
			"backendConfigsFrom": []any{map[string]any{"kind": "Secret", "name": "b", "keys": []any{"namespace"}}},
		}, func(t *testing.T, r Result) {
			unmapped("spec.backendConfigsFrom[0]", "kubernetes backend")(t, r)
			if r.Stack.Spec.Backend != nil || r.StateSecret == "" {
				t.Errorf("backend %+v state %q", r.Stack.Spec.Backend, r.StateSecret)
			}
		}},
		{"a custom backend that is not HCL", map[string]any{"backendConfig": map[string]any{"customConfiguration": `backend "s3" {`}}, func(t *testing.T, r Result) {
			unmapped("spec.backendConfig.customConfiguration", "not valid HCL")(t, r)
			if r.Stack.Spec.Backend != nil || r.StateSecret == "" {
				t.Errorf("backend %+v state %q", r.Stack.Spec.Backend, r.StateSecret)
			}
		}},
		{"a custom backend nested to overflow the stack", map[string]any{"backendConfig": map[string]any{"customConfiguration": "backend \"s3\" {\n  bucket = " + strings.Repeat("[", 60000) + "\n}\n"}},
			unmapped("spec.backendConfig.customConfiguration", "spec.backendConfig.customConfiguration:2:267: nesting deeper than 256 levels")},
		{"a local custom backend", map[string]any{"backendConfig": map[string]any{"customConfiguration": "backend \"local\" {\n  path = \"x\"\n}\n"}}, unmapped("spec.backendConfig.customConfiguration", "runner pod")},
		{"custom configuration without a backend", map[string]any{"backendConfig": map[string]any{"customConfiguration": "required_version = \"1.6\"\n"}}, unmapped("spec.backendConfig.customConfiguration", "no backend")},
		{"tfstate auto unlock", map[string]any{"tfstate": map[string]any{"forceUnlock": "auto", "lockTimeout": "0s"}}, func(t *testing.T, r Result) {
			if len(r.Unmapped) != 0 {
				t.Errorf("unmapped %+v", r.Unmapped)
			}
		}},
		{"tfstate one-off unlock and timeout", map[string]any{"tfstate": map[string]any{"forceUnlock": "yes", "lockIdentifier": "f2ab", "lockTimeout": "30s"}}, func(t *testing.T, r Result) {
			unmapped("spec.tfstate.forceUnlock", "terrace force-unlock app f2ab")(t, r)
			unmapped("spec.tfstate.lockTimeout", "retried with backoff")(t, r)
		}},
		{"tfstate of a bad value", map[string]any{"tfstate": map[string]any{"forceUnlock": "maybe"}}, unmapped("spec.tfstate", `"maybe"`)},
		{"inventory", map[string]any{"enableInventory": true}, func(t *testing.T, r Result) {
			if len(r.Unmapped) != 0 {
				t.Errorf("unmapped %+v", r.Unmapped)
			}
		}},
	})
}

func listReasons(r Result) string {
	var b strings.Builder
	for _, u := range r.Unmapped {
		b.WriteString(u.Field + ": " + u.Reason + "\n")
	}
	return b.String()
}

// Fields without a Terrace equivalent are listed only when they ask for
// something; their zero values are not noise.
func TestUnmappableFields(t *testing.T) {
	for field, value := range map[string]any{
		"destroy":                             true,
		"cloud":                               map[string]any{"organization": "o"},
		"force":                               true,
		"readInputsFromSecrets":               []any{map[string]any{"name": "s", "as": "x"}},
		"cliConfigSecretRef":                  map[string]any{"name": "cli"},
		"alwaysCleanupRunnerPod":              false,
		"runnerTerminationGracePeriodSeconds": int64(60),
		"refreshBeforeApply":                  true,
		"plan":                                map[string]any{"lock": false},
		"webhooks":                            []any{map[string]any{"stage": "post-planning", "url": "http://x"}},
		"enterprise":                          map[string]any{"a": 1},
		"breakTheGlass":                       true,
		"branchPlanner":                       map[string]any{"enablePathScope": true},
		"remediation":                         map[string]any{"retries": int64(3)},
	} {
		r, err := Convert(terraform(map[string]any{field: value}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if reasonFor(r, "spec."+field) == "" || len(r.Unmapped) != 1 {
			t.Errorf("%s: unmapped %+v", field, r.Unmapped)
		}
		zero, err := Convert(terraform(map[string]any{field: zeroOf(value)}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if field != "alwaysCleanupRunnerPod" && len(zero.Unmapped) != 0 {
			t.Errorf("%s: its zero value is listed: %+v", field, zero.Unmapped)
		}
	}
	if r, _ := Convert(terraform(map[string]any{"alwaysCleanupRunnerPod": true}), Options{}); len(r.Unmapped) != 0 {
		t.Errorf("alwaysCleanupRunnerPod: true (Terrace's behaviour) is listed: %+v", r.Unmapped)
	}
	if r, _ := Convert(terraform(map[string]any{"force": "yes"}), Options{}); !strings.Contains(reasonFor(r, "spec.force"), "want a boolean") {
		t.Errorf("force of the wrong type: %+v", r.Unmapped)
	}
}

func zeroOf(v any) any {
	switch v.(type) {
	case bool:
		return false
	case []any:
		return []any{}
	case map[string]any:
		return map[string]any{}
	}
	return nil
}

// Objects that are not v1alpha2 Terraforms, or cannot be a Stack, are errors.
func TestConvertRefusesBadObjects(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*unstructured.Unstructured)
		want   string
	}{
		"v1alpha1":     {func(u *unstructured.Unstructured) { u.SetAPIVersion(TerraformGroup + "/v1alpha1") }, "only v1alpha2"},
		"another kind": {func(u *unstructured.Unstructured) { u.SetKind("Kustomization") }, "only v1alpha2 Terraform"},
		"no name":      {func(u *unstructured.Unstructured) { u.SetName("") }, "no metadata.name"},
		"no spec":      {func(u *unstructured.Unstructured) { delete(u.Object, "spec") }, "has no spec"},
		"no sourceRef": {func(u *unstructured.Unstructured) { delete(u.Object["spec"].(map[string]any), "sourceRef") }, "no spec.sourceRef"},
		"a bad source kind": {func(u *unstructured.Unstructured) {
			u.Object["spec"].(map[string]any)["sourceRef"] = map[string]any{"kind": "HelmRepository", "name": "x"}
		}, `"HelmRepository" is not a Flux`},
		"a source without a name": {func(u *unstructured.Unstructured) {
			u.Object["spec"].(map[string]any)["sourceRef"] = map[string]any{"kind": "Bucket"}
		}, "sourceRef has no name"},
	} {
		t.Run(name, func(t *testing.T) {
			obj := terraform(nil)
			tc.change(obj)
			_, err := Convert(obj, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
