package tf

import (
	"errors"
	"strings"
	"testing"
)

func TestUndeclaredVariablesNeedACompleteModule(t *testing.T) {
	e := newTestExecutor(t, "/bin/true", nil, "")
	writeModule(t, e, map[string]string{
		"variables.tf":     "variable \"n\" {}\nvariable \"region\" {}\n",
		"more.tf.json":     `{"variable": {"zone": {}}}`,
		"prod.auto.tfvars": "n = 1\n",
	})
	e.moduleDir = e.SourceDir()
	vars := Variables{JSON: []byte(`{"false": 3, "region": "eu", "zone": "a", "extra": 1}`)}
	undeclared, declared := e.undeclaredVariables(vars)
	if strings.Join(undeclared, ",") != "extra,false" || strings.Join(declared, ",") != "n,region,zone" {
		t.Fatalf("undeclared %v, declared %v", undeclared, declared)
	}
	err := checkDeclared(undeclared, declared)
	if !errors.Is(err, ErrUndeclaredVariable) || !strings.Contains(err.Error(), `set "extra", "false", which the module does not declare (it declares n, region, zone)`) {
		t.Fatalf("checkDeclared = %v", err)
	}
	if err := checkDeclared([]string{"extra"}, declared); err != nil {
		t.Fatalf("an ordinary undeclared name was refused before tofu ran: %v", err)
	}

	// A file that does not parse may hide declarations: no verdict.
	writeModule(t, e, map[string]string{"broken.tf": "variable \"false\" {"})
	if undeclared, _ := e.undeclaredVariables(vars); undeclared != nil {
		t.Fatalf("with an unparsable file, undeclared = %v, want none", undeclared)
	}
}

func TestOnlyAMissingRequiredValueIsExplained(t *testing.T) {
	missing := &CommandError{Op: "tofu plan", Message: "Error: No value for required variable\n\non main.tf line 1:\n variable \"region\" {}"}
	other := &CommandError{Op: "tofu plan", Message: "Error: Unsupported argument"}
	if err := explainUndeclared(other, []string{"regoin"}, []string{"region"}); err != other {
		t.Errorf("an unrelated failure was rewritten: %v", err)
	}
	if err := explainUndeclared(missing, nil, []string{"region"}); err != missing {
		t.Errorf("a failure without undeclared names was rewritten: %v", err)
	}
	err := explainUndeclared(missing, []string{"regoin"}, []string{"region"})
	var cmdErr *CommandError
	if !errors.Is(err, ErrUndeclaredVariable) || !errors.As(err, &cmdErr) || !strings.Contains(err.Error(), "No value for required variable") {
		t.Fatalf("explained error %v keeps neither the reason nor tofu's words", err)
	}
}
