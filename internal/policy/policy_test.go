package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// planJSON is the part of `tofu show -json` the policies below read.
const planJSON = `{"format_version":"1.2","resource_changes":[
 {"address":"terraform_data.app","type":"terraform_data","change":{"actions":["create"],"after":{"input":"x"}}},
 {"address":"null_resource.legacy","type":"null_resource","change":{"actions":["create"],"after":{}}}
]}`

const denyTerraformData = `package terrace

deny contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	msg := sprintf("%s: terraform_data is not allowed", [rc.address])
}

warn contains msg if {
	some rc in input.resource_changes
	rc.type == "null_resource"
	msg := sprintf("%s: null_resource is deprecated", [rc.address])
}
`

func TestDecisions(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name           string
		modules        []Module
		wantViolations []string
		wantWarnings   []string
	}{
		{
			name:           "deny and warn",
			modules:        []Module{{Name: "ns/p/deny.rego", Source: denyTerraformData}},
			wantViolations: []string{"terraform_data.app: terraform_data is not allowed"},
			wantWarnings:   []string{"null_resource.legacy: null_resource is deprecated"},
		},
		{
			name: "rules across modules of the package add up",
			modules: []Module{
				{Name: "a.rego", Source: "package terrace\n\ndeny contains \"first\" if { count(input.resource_changes) > 1 }\n"},
				{Name: "b.rego", Source: "package terrace\n\ndeny contains \"second\" if { true }\n"},
			},
			wantViolations: []string{"first", "second"},
		},
		{
			name:    "no rule matches",
			modules: []Module{{Name: "a.rego", Source: "package terrace\n\ndeny contains \"never\" if { input.nothing }\n"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := Compile(ctx, tt.modules)
			if err != nil {
				t.Fatal(err)
			}
			d, err := set.Evaluate(ctx, []byte(planJSON))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(d.Violations, "|") != strings.Join(tt.wantViolations, "|") {
				t.Errorf("violations %q, want %q", d.Violations, tt.wantViolations)
			}
			if strings.Join(d.Warnings, "|") != strings.Join(tt.wantWarnings, "|") {
				t.Errorf("warnings %q, want %q", d.Warnings, tt.wantWarnings)
			}
			if d.Allowed() != (len(tt.wantViolations) == 0) {
				t.Errorf("Allowed() = %v", d.Allowed())
			}
		})
	}
}

func TestInvalidPolicies(t *testing.T) {
	tests := []struct {
		name, source, want string
	}{
		{"syntax error names the module", "package terrace\n\ndeny contains msg if {\n", "bad.rego:4: rego_parse_error"},
		{"other package", "package main\n\ndeny contains \"x\" if { true }\n", "must be package terrace"},
		{"network builtin", "package terrace\n\ndeny contains \"x\" if { http.send({\"method\": \"get\", \"url\": \"http://169.254.169.254/\"}) }\n", "http.send"},
		{"process environment", "package terrace\n\ndeny contains x if { x := opa.runtime().env.HOME }\n", "opa.runtime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(context.Background(), []Module{{Name: "bad.rego", Source: tt.source}})
			var invalid *InvalidError
			if !errors.As(err, &invalid) {
				t.Fatalf("want an InvalidError, got %v", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestDigestIgnoresOrderButNotContent(t *testing.T) {
	a, b := Module{Name: "a.rego", Source: "package terrace"}, Module{Name: "b.rego", Source: "package terrace\n"}
	if Digest([]Module{a, b}) != Digest([]Module{b, a}) {
		t.Error("the digest depends on the order of the modules")
	}
	changed := b
	changed.Source += "deny contains \"x\" if { true }\n"
	if Digest([]Module{a, b}) == Digest([]Module{a, changed}) {
		t.Error("the digest does not change with a module's source")
	}
}

func TestEvaluateRefusesBrokenPlanJSON(t *testing.T) {
	set, err := Compile(context.Background(), []Module{{Name: "a.rego", Source: denyTerraformData}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Evaluate(context.Background(), []byte("{not json")); err == nil {
		t.Error("a broken plan JSON gave a decision")
	}
}
