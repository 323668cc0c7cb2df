// Package fuzzcorpus keeps the seed corpora of Terrace's fuzz targets in
// testdata/fuzz/<FuzzName>/, where `go test` runs them as ordinary tests and
// `go test -fuzz` starts from them. Seeds are written by code (so a reader
// sees why each one is there) and checked in; Check fails when the files
// and the code disagree, and rewrites them when TERRACE_UPDATE_FUZZ_SEEDS=1.
package fuzzcorpus

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// UpdateEnv names the environment variable that makes Check write the files.
const UpdateEnv = "TERRACE_UPDATE_FUZZ_SEEDS"

// Seed is one named input of a fuzz target: its arguments, in order, each a
// []byte or a string (the types Terrace's targets take).
type Seed struct {
	Name string
	Args []any
}

// Check compares testdata/fuzz/<target>/seed-<name> with each seed.
func Check(t *testing.T, target string, seeds []Seed) {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	update := os.Getenv(UpdateEnv) == "1"
	for _, s := range seeds {
		want, err := Encode(s.Args...)
		if err != nil {
			t.Fatalf("seed %s of %s: %v", s.Name, target, err)
		}
		path := filepath.Join(dir, "seed-"+s.Name)
		if update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("seed %s is not checked in as %s (%v): run `%s=1 go test -run %s` in the package and commit testdata/fuzz", s.Name, path, err, UpdateEnv, t.Name())
		}
	}
}

// Encode renders args in the corpus file format of `go test -fuzz`
// ("go test fuzz v1", then one Go literal per line).
func Encode(args ...any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		default:
			return nil, fmt.Errorf("unsupported seed argument type %T", a)
		}
	}
	return b.Bytes(), nil
}
