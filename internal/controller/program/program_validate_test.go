package program

import (
	"fmt"
	"strings"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func TestValidateFiles(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]terracev1.ProgramFile
		wantErr string // "" means valid
	}{
		{name: "valid module", files: files("main.tf", "locals { a = 1 }\n", "x.tofu", "locals {}\n", "y.tf.json", `{"locals":{"b":2}}`, "prod.tfvars", "a = 1\n", "p.tfvars.json", `{"a":1}`, "tests/a.tftest.hcl", "run \"x\" {}\n")},
		{name: "templates are not parsed", files: files("main.tf", "locals {}\n", "templates/x.tpl", "${{{ not hcl", "README.md", "# }}}")},
		{name: "invalid hcl names file, line and column", files: files("main.tf", "locals {}\n", "modules/x/main.tf", "locals {\n  a = 1\n  b = = 2\n}\n"), wantErr: "modules/x/main.tf:3:7: Invalid expression"},
		{name: "unclosed block", files: files("main.tf", "resource \"a\" \"b\" {\n"), wantErr: "main.tf:1:"},
		{name: "invalid tfvars", files: files("prod.tfvars", "a = \n"), wantErr: "prod.tfvars:"},
		{name: "invalid tofu file", files: files("main.tofu", "locals {{\n"), wantErr: "main.tofu:1:"},
		{name: "invalid json", files: files("main.tf.json", `{"locals": }`), wantErr: "main.tf.json:1:"},
		{name: "invalid tfvars json", files: files("a.tfvars.json", `[`), wantErr: "a.tfvars.json:1:"},
		{name: "errors in several files are all named, in order", files: files("b.tf", "b {\n", "a.tf", "a {\n"), wantErr: "a.tf:1:"},
		{name: "bad name", files: files("../x.tf", "locals {}\n"), wantErr: `invalid file name "../x.tf"`},
		{name: "too large", files: files("a.tf", strings.Repeat("#\n", terracev1.ProgramMaxTotalSize/2+1)), wantErr: "more than the 524288 allowed"},
		{name: "empty", files: files(), wantErr: "no files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateFiles(tc.files)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatal("accepted")
			case tc.wantErr != "" && !strings.HasPrefix(err.Error(), tc.wantErr) && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("error %q does not name %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateFilesReportsTheFirstFewDiagnostics(t *testing.T) {
	f := map[string]terracev1.ProgramFile{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		f[n+".tf"] = "x = = 1\n"
	}
	err := validateFiles(f)
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "a.tf:1:") || !strings.Contains(msg, "e.tf:1:") || strings.Contains(msg, "f.tf:") || !strings.HasSuffix(msg, "and 2 more") {
		t.Fatalf("message: %s", msg)
	}
}

// TestValidateFilesSurvivesNestingBombs is the attack of a Stack author on
// the controller: a small Program whose file nests so deep that HCL's
// recursive parsers overflow the goroutine stack, a fatal error that ends
// the controller (and the next leader, which reconciles the same Program).
// Each is refused before parsing, as InvalidProgram naming file:line:col;
// before the nesting check, each of these crashed this test binary.
func TestValidateFilesSurvivesNestingBombs(t *testing.T) {
	for _, tc := range []struct {
		name, file, content, wantErr string
	}{
		{name: "60,000 [ in HCL", file: "main.tf", content: "a = " + strings.Repeat("[", 60000),
			wantErr: "main.tf:1:261: Nesting too deep: nesting deeper than 256 levels"},
		{name: "500,000 [ in JSON", file: "main.tf.json", content: strings.Repeat("[", 500000),
			wantErr: "main.tf.json:1:257: Nesting too deep: nesting deeper than 256 levels"},
		{name: "500,000 - in HCL, no bracket at all", file: "main.tf", content: "a = " + strings.Repeat("-", 500000) + "1",
			wantErr: "main.tf:1:261: Nesting too deep"},
		{name: "170,000 balanced [*] splats in HCL", file: "vars.tfvars", content: "a = x" + strings.Repeat("[*]", 170000),
			wantErr: "vars.tfvars:1:"},
		{name: "templates in templates in a module", file: "modules/x/main.tf", content: "a = " + strings.Repeat(`"${`, 100000),
			wantErr: "modules/x/main.tf:1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateFiles(files("ok.tf", "locals {}\n", tc.file, tc.content))
			if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "nesting deeper than 256 levels") {
				t.Fatalf("error %v, want it to start with %q", err, tc.wantErr)
			}
		})
	}
}

// TestValidateFilesAcceptsDeepButSaneFiles: nesting real modules use, and
// long files of shallow expressions, still validate.
func TestValidateFilesAcceptsDeepButSaneFiles(t *testing.T) {
	deep := "a = " + strings.Repeat("[", 200) + strings.Repeat("]", 200) + "\n"
	blocks := strings.Repeat("dynamic \"x\" {\ncontent {\n", 40) + strings.Repeat("}\n}\n", 40)
	var long strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&long, "v%d = var.enabled ? -%d + 2 * local.n : !true\n", i, i)
	}
	jsonDeep := strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200)
	err := validateFiles(files("deep.tfvars", deep, "blocks.tf", "resource \"a\" \"b\" {\n"+blocks+"}\n",
		"long.tfvars", long.String(), "deep.tfvars.json", jsonDeep,
		"strings.tf", `locals { s = "`+strings.Repeat("[{(", 10000)+`${1}" }`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
}
