package tf

import (
	"strings"
	"testing"
)

// applyStream is `tofu apply -auto-approve -json` of one new resource and
// one output (OpenTofu 1.12), trimmed to the fields the stream reads.
const applyStream = `{"@message":"OpenTofu 1.12.6","tofu":"1.12.6","type":"version","ui":"1.2"}
{"@message":"terraform_data.item: Plan to create","change":{"action":"create"},"type":"planned_change"}
{"@message":"Plan: 1 to add, 0 to change, 0 to destroy.","changes":{"add":1,"change":0,"import":0,"remove":0,"forget":0,"operation":"plan"},"type":"change_summary"}
{"@message":"Outputs: 1","outputs":{"name":{"sensitive":false,"action":"create"}},"type":"outputs"}
{"@message":"terraform_data.item: Creating...","type":"apply_start"}
{"@message":"terraform_data.item: Creation complete after 0s [id=a1]","type":"apply_complete"}
{"@message":"Apply complete! Resources: 1 added, 0 changed, 0 destroyed.","changes":{"add":1,"change":0,"import":0,"remove":0,"forget":0,"operation":"apply"},"type":"change_summary"}
{"@message":"Outputs: 1","outputs":{"name":{"sensitive":false,"type":"string","value":"bench-1"}},"type":"outputs"}
`

// An apply's stream counts the plan's changes, not the apply's closing
// summary or output values, and says when the plan was complete: before
// the first apply message, with the plan's outputs counted.
func TestApplyStreamKeepsThePlansSummary(t *testing.T) {
	var lines []string
	s := newUIStream(newLineWriter(NewRedactor(), func(l string) { lines = append(lines, l) }))
	var atPlanned Summary
	s.onPlanned = func() { atPlanned = s.result() }
	for _, l := range strings.SplitAfter(applyStream, "\n") {
		_, _ = s.Write([]byte(l))
	}
	s.Flush()
	want := Summary{Add: 1, OutputChanges: 1}
	if !s.planned() || atPlanned != want {
		t.Fatalf("at planned: %+v (planned %v), want %+v", atPlanned, s.planned(), want)
	}
	if got := s.result(); got != want || !got.hasChanges() {
		t.Errorf("summary after the apply = %+v, want the plan's %+v", got, want)
	}
	if v := s.toolVersion(); v != "1.12.6" {
		t.Errorf("version = %q", v)
	}
	if len(lines) != 8 || lines[4] != "terraform_data.item: Creating..." {
		t.Errorf("log lines %q", lines)
	}
}

// A plan -json stream's summary is read as before: its change_summary has
// operation "plan", and its outputs have actions.
func TestPlanStreamWithoutChanges(t *testing.T) {
	s := newUIStream(newLineWriter(NewRedactor(), func(string) {}))
	_, _ = s.Write([]byte(`{"@message":"Plan: 0 to add, 0 to change, 0 to destroy.","changes":{"add":0,"change":0,"import":0,"remove":0,"forget":0,"operation":"plan"},"type":"change_summary"}
{"@message":"Outputs: 1","outputs":{"name":{"sensitive":false,"action":"noop"}},"type":"outputs"}
`))
	s.Flush()
	if s.planned() || s.result().hasChanges() {
		t.Errorf("planned %v, summary %+v: a plan without changes", s.planned(), s.result())
	}
}
