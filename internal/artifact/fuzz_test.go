package artifact

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzExtract feeds arbitrary bytes to Extract. Whatever the input, nothing
// may appear outside dest; a failed extraction leaves dest empty; a
// successful one holds only regular files, directories and symlinks that
// resolve inside dest.
func FuzzExtract(f *testing.F) {
	for _, tc := range hostileArchives(f) {
		if len(tc.archive) < 64<<10 { // keep the corpus small; the bombs are covered by the table test
			f.Add(tc.archive)
		}
	}
	valid, _, err := Build(sampleFiles())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(makeTarGz(f, file("common/vars.tf", "x"), symlink("modules/vars.tf", "../common/vars.tf"), symlink("shared", "common")))
	f.Add([]byte{})

	limits := Limits{MaxCompressedSize: 1 << 20, MaxUncompressedSize: 1 << 20, MaxFileSize: 256 << 10, MaxEntries: 64}
	f.Fuzz(func(t *testing.T, archive []byte) {
		s := newSandbox(t)
		err := Extract(bytes.NewReader(archive), s.dest, limits)
		s.assertContained(t)
		if err != nil {
			if left := listTree(t, s.dest); len(left) != 0 {
				t.Fatalf("failed extraction (%v) left entries: %v", err, left)
			}
			return
		}
		destReal, err := filepath.EvalSymlinks(s.dest)
		if err != nil {
			t.Fatal(err)
		}
		walkErr := filepath.WalkDir(s.dest, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			mode := d.Type()
			switch {
			case mode.IsRegular(), mode.IsDir():
			case mode&os.ModeSymlink != 0:
				resolved, err := filepath.EvalSymlinks(p)
				if err != nil {
					t.Fatalf("symlink %s does not resolve: %v", p, err)
				}
				if resolved != destReal && !strings.HasPrefix(resolved, destReal+string(filepath.Separator)) {
					t.Fatalf("symlink %s resolves outside dest to %s", p, resolved)
				}
			default:
				t.Fatalf("%s has a special type %v", p, mode)
			}
			return nil
		})
		if walkErr != nil {
			t.Fatal(walkErr)
		}
	})
}
