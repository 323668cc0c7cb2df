// Package argocd_test runs the Argo CD health checks shipped in
// config/argocd in a Lua interpreter against Stacks and Programs in the
// states users meet.
package argocd_test

import (
	"os"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

// health runs an Argo CD health script on obj, as Argo CD does: obj is a
// global table, the script returns {status, message}.
func health(t *testing.T, script string, obj map[string]any) (status, message string) {
	t.Helper()
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		t.Fatalf("the health script failed: %v", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("the health script returned %v, want a table", L.Get(-1))
	}
	return ret.RawGetString("status").String(), ret.RawGetString("message").String()
}

// toLua converts decoded YAML/JSON to Lua values (arrays 1-based).
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range v {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case nil:
		return lua.LNil
	}
	panic("unexpected type")
}

func object(t *testing.T, doc string) map[string]any {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

func readScript(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestStackHealth(t *testing.T) {
	script := readScript(t, "stack-health.lua")
	cases := []struct {
		name, doc, status, message string
	}{
		{"new", `
metadata: {name: web, generation: 1}
spec: {}`, "Progressing", "Waiting for the Terrace controller"},
		{"ready", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Applied, message: "applied 2@sha256:e3f62017 (release 2)"}`, "Healthy", "applied 2@sha256:e3f62017 (release 2)"},
		{"planning a new generation", `
metadata: {name: web, generation: 3}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Applied, message: "applied"}
  - {type: Reconciling, status: "True", reason: Progressing, message: "planning 3@sha256:aa"}`, "Progressing", "planning 3@sha256:aa"},
		{"running", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "Unknown", reason: Progressing, message: "applying"}
  - {type: Reconciling, status: "True", reason: Progressing, message: "applying approved plan plan-2-abc"}`, "Progressing", "applying approved plan plan-2-abc"},
		{"pending approval", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "False", reason: AwaitingApproval, message: "plan plan-2-abc (+1 ~0 -0) awaits approval: set spec.approvePlan to it"}`, "Suspended", "plan plan-2-abc (+1 ~0 -0) awaits approval: set spec.approvePlan to it"},
		{"failed", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "False", reason: UndeclaredVariable, message: "plan failed: quote the key"}
  - {type: Stalled, status: "True", reason: UndeclaredVariable, message: "plan failed: quote the key"}`, "Degraded", "UndeclaredVariable: plan failed: quote the key"},
		{"failed, retrying", `
metadata: {name: web, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "False", reason: ReconciliationFailed, message: "the runner died"}`, "Degraded", "ReconciliationFailed: the runner died"},
		{"suspended", `
metadata: {name: web, generation: 2}
spec: {suspend: true}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "True", reason: Applied, message: "applied"}`, "Suspended", "Stack is suspended: terrace resume web"},
	}
	for _, c := range cases {
		status, message := health(t, script, object(t, c.doc))
		if status != c.status || message != c.message {
			t.Errorf("%s: health %s %q, want %s %q", c.name, status, message, c.status, c.message)
		}
	}
}

func TestProgramHealth(t *testing.T) {
	script := readScript(t, "program-health.lua")
	cases := []struct{ name, doc, status string }{
		{"new", `metadata: {name: p, generation: 1}`, "Progressing"},
		{"ready", `
metadata: {name: p, generation: 1}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "True", reason: Succeeded, message: "serving artifact for revision 1@sha256:e3f62017"}]`, "Healthy"},
		{"invalid", `
metadata: {name: p, generation: 2}
status:
  observedGeneration: 2
  conditions:
  - {type: Ready, status: "False", reason: InvalidProgram, message: "main.tf:3:1: bad"}
  - {type: Stalled, status: "True", reason: InvalidProgram, message: "main.tf:3:1: bad"}`, "Degraded"},
		{"old generation", `
metadata: {name: p, generation: 3}
status:
  observedGeneration: 2
  conditions: [{type: Ready, status: "True", reason: Succeeded, message: "serving"}]`, "Progressing"},
	}
	for _, c := range cases {
		if status, message := health(t, script, object(t, c.doc)); status != c.status {
			t.Errorf("%s: health %s (%s), want %s", c.name, status, message, c.status)
		}
	}
}

// argocd-cm.yaml must carry the scripts that are tested, unchanged.
func TestArgoCDConfigMapCarriesTheScripts(t *testing.T) {
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(readScript(t, "argocd-cm.yaml")), &cm); err != nil {
		t.Fatal(err)
	}
	for key, file := range map[string]string{
		"resource.customizations.health.terrace.dev_Stack":   "stack-health.lua",
		"resource.customizations.health.terrace.dev_Program": "program-health.lua",
	} {
		if strings.TrimSpace(cm.Data[key]) != strings.TrimSpace(readScript(t, file)) {
			t.Errorf("argocd-cm.yaml %s differs from %s", key, file)
		}
	}
}
