package tf

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteInsideRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "target"), filepath.Join(root, "file-link")); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"", ".", "..", "../x", "a/../../x", "/etc/passwd", "link/creds", "link/sub/creds", "file-link"} {
		t.Run(rel, func(t *testing.T) {
			err := writeInside(root, rel, []byte("secret"))
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("writeInside(%q) = %v, want an invalid argument", rel, err)
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 0 {
				t.Fatalf("a file was written outside the root: %v", entries)
			}
		})
	}
}

func TestWriteInsideWritesPrivateFiles(t *testing.T) {
	root := t.TempDir()
	if err := writeInside(root, ".aws/credentials", []byte("[default]\n")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, ".aws", "credentials"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	// Written again (a second init) it is replaced, not appended to.
	if err := writeInside(root, ".aws/credentials", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, ".aws", "credentials")); string(b) != "x" {
		t.Errorf("content %q", b)
	}
}
