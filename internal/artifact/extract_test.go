package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// entry is one member of a hand-made (possibly hostile) archive.
type entry struct {
	hdr  tar.Header
	body []byte
}

func file(name, body string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body: []byte(body)}
}

func dir(name string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}}
}

func symlink(name, target string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}

func special(name string, typ byte, link string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: typ, Linkname: link, Mode: 0o644}}
}

func makeTarGz(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		hdr := e.hdr
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("failed to write header %q: %v", hdr.Name, err)
		}
		if len(e.body) > 0 {
			if _, err := tw.Write(e.body); err != nil {
				t.Fatalf("failed to write body %q: %v", hdr.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// truncated is an archive cut in the middle of an incompressible file.
func truncated(t testing.TB) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	body := make([]byte, 8000)
	for i := range body {
		body[i] = byte('a' + rng.IntN(26))
	}
	data := makeTarGz(t, file("a.tf", string(body)))
	return data[:len(data)/2]
}

// metadataBomb holds a few empty files whose PAX headers carry ~900 KiB
// each: no file content, yet megabytes to decompress.
func metadataBomb(t testing.TB) []byte {
	t.Helper()
	var entries []entry
	for i := range 5 {
		e := file(string(rune('a'+i))+".tf", "")
		e.hdr.Format = tar.FormatPAX
		e.hdr.PAXRecords = map[string]string{"comment": strings.Repeat("x", 900<<10)}
		entries = append(entries, e)
	}
	return makeTarGz(t, entries...)
}

// sandbox is a directory holding dest and a sibling "outside" with a
// sentinel file, so a test can see any write that leaves dest.
type sandbox struct {
	base, dest, outside string
}

func newSandbox(t testing.TB) sandbox {
	t.Helper()
	base := t.TempDir()
	s := sandbox{base: base, dest: filepath.Join(base, "dest"), outside: filepath.Join(base, "outside")}
	if err := os.MkdirAll(s.outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.outside, "sentinel"), []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// listTree returns every path under dir, relative, with a type marker.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			rel += " -> " + target
		case d.IsDir():
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// assertContained fails unless the sandbox outside dest is as it was.
func (s sandbox) assertContained(t testing.TB) {
	t.Helper()
	got := listTree(t, s.base)
	var outsideDest []string
	for _, p := range got {
		if p != "dest/" && !strings.HasPrefix(p, "dest/") && !strings.HasPrefix(p, "dest"+string(filepath.Separator)) {
			outsideDest = append(outsideDest, p)
		}
	}
	want := []string{"outside/", "outside/sentinel"}
	if strings.Join(outsideDest, ",") != strings.Join(want, ",") {
		t.Fatalf("something was written outside dest: %v", outsideDest)
	}
	if b, err := os.ReadFile(filepath.Join(s.outside, "sentinel")); err != nil || string(b) != "untouched" {
		t.Fatalf("sentinel outside dest was changed: %q %v", b, err)
	}
}

// hostileArchives are refused by Extract; each also seeds FuzzExtract.
func hostileArchives(t testing.TB) []struct {
	name    string
	archive []byte
	limits  Limits
	wantErr string
	kind    error
} {
	zeros := make([]byte, 8<<20)
	bomb := makeTarGz(t, file("bomb.bin", string(zeros)))
	return []struct {
		name    string
		archive []byte
		limits  Limits
		wantErr string
		kind    error
	}{
		{name: "dot-dot entry", archive: makeTarGz(t, file("ok.tf", "x"), file("../evil.tf", "x")), wantErr: `"../evil.tf"`, kind: ErrUnsafeEntry},
		{name: "dot-dot inside the name", archive: makeTarGz(t, file("a/../../outside/evil", "x")), wantErr: `"a/../../outside/evil"`, kind: ErrUnsafeEntry},
		{name: "absolute path", archive: makeTarGz(t, file("/tmp/evil.tf", "x")), wantErr: `absolute path`, kind: ErrUnsafeEntry},
		{name: "symlink escaping the root", archive: makeTarGz(t, symlink("link", "../outside")), wantErr: `symlink "link" points to "../outside", outside the archive root`, kind: ErrUnsafeEntry},
		{name: "absolute symlink", archive: makeTarGz(t, symlink("etc", "/etc")), wantErr: `symlink "etc" points to the absolute path "/etc"`, kind: ErrUnsafeEntry},
		{name: "symlink chain escaping the root", archive: makeTarGz(t, dir("d/"), symlink("d/up", ".."), symlink("y", "d/up/../outside")), wantErr: `resolves outside the archive root`, kind: ErrUnsafeEntry},
		{name: "dangling symlink", archive: makeTarGz(t, symlink("gone", "missing.tf")), wantErr: `not in the archive`, kind: ErrUnsafeEntry},
		{name: "file written through a symlink", archive: makeTarGz(t, dir("sub/"), symlink("l", "sub"), file("l/evil.tf", "x")), wantErr: `"l"`, kind: ErrUnsafeEntry},
		{name: "hard link escaping the root", archive: makeTarGz(t, special("h", tar.TypeLink, "../outside/sentinel")), wantErr: `entry "h" is a hard link`, kind: ErrUnsafeEntry},
		{name: "hard link inside the root", archive: makeTarGz(t, file("a.tf", "x"), special("b.tf", tar.TypeLink, "a.tf")), wantErr: `entry "b.tf" is a hard link`, kind: ErrUnsafeEntry},
		{name: "character device", archive: makeTarGz(t, special("null", tar.TypeChar, "")), wantErr: `entry "null" is a device or FIFO`, kind: ErrUnsafeEntry},
		{name: "block device", archive: makeTarGz(t, special("sda", tar.TypeBlock, "")), wantErr: `entry "sda" is a device or FIFO`, kind: ErrUnsafeEntry},
		{name: "fifo", archive: makeTarGz(t, special("pipe", tar.TypeFifo, "")), wantErr: `entry "pipe" is a device or FIFO`, kind: ErrUnsafeEntry},
		{name: "duplicate entry", archive: makeTarGz(t, file("a.tf", "x"), file("a.tf", "y")), wantErr: `entry "a.tf" appears twice`, kind: ErrUnsafeEntry},
		{name: "file over the per-file limit", archive: makeTarGz(t, file("big.tf", strings.Repeat("x", 2048))), limits: Limits{MaxFileSize: 1024}, wantErr: `entry "big.tf" is 2048 bytes`, kind: ErrLimitExceeded},
		{name: "archive over the uncompressed limit", archive: makeTarGz(t, file("a.tf", strings.Repeat("x", 600)), file("b.tf", strings.Repeat("x", 600))), limits: Limits{MaxUncompressedSize: 1000}, wantErr: `entry "b.tf" takes the archive past 1000 uncompressed bytes`, kind: ErrLimitExceeded},
		{name: "too many entries", archive: makeTarGz(t, file("1.tf", ""), file("2.tf", ""), file("3.tf", ""), file("4.tf", "")), limits: Limits{MaxEntries: 3}, wantErr: `more than 3 entries`, kind: ErrLimitExceeded},
		{name: "archive over the compressed limit", archive: makeTarGz(t, file("a.tf", strings.Repeat("random-ish ", 400))), limits: Limits{MaxCompressedSize: 64}, wantErr: `archive is larger than 64 bytes`, kind: ErrLimitExceeded},
		{name: "gzip bomb", archive: bomb, limits: Limits{MaxUncompressedSize: 1 << 20, MaxFileSize: 64 << 20}, wantErr: `entry "bomb.bin" takes the archive past`, kind: ErrLimitExceeded},
		{name: "gzip bomb of metadata", archive: metadataBomb(t), limits: Limits{MaxUncompressedSize: 1 << 20, MaxEntries: 10}, wantErr: `decompressed archive is larger than`, kind: ErrLimitExceeded},
		{name: "not gzip", archive: []byte("this is not an archive"), wantErr: `failed to read gzip header`},
		{name: "truncated", archive: truncated(t), wantErr: `entry "a.tf"`},
	}
}

func TestExtractRefusesHostileArchives(t *testing.T) {
	for _, tc := range hostileArchives(t) {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			err := Extract(bytes.NewReader(tc.archive), s.dest, tc.limits)
			if err == nil {
				t.Fatalf("extraction succeeded; tree: %v", listTree(t, s.dest))
			}
			t.Logf("refused: %v", err)
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tc.wantErr)
			}
			if tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Fatalf("error %q is not %v", err, tc.kind)
			}
			s.assertContained(t)
			if left := listTree(t, s.dest); len(left) != 0 {
				t.Fatalf("a failed extraction left entries behind: %v", left)
			}
		})
	}
}

func TestExtractRoundTrip(t *testing.T) {
	files := sampleFiles()
	data, digest, err := Build(files)
	if err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t)
	if err := ExtractBytes(data, digest, s.dest, Limits{}); err != nil {
		t.Fatal(err)
	}
	s.assertContained(t)
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(s.dest, filepath.FromSlash(name)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: got %q, %v; want %q", name, got, err, want)
		}
		info, _ := os.Stat(filepath.Join(s.dest, filepath.FromSlash(name)))
		if info.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v", name, info.Mode())
		}
	}
}

func TestExtractAllowsSymlinksInsideTheRoot(t *testing.T) {
	s := newSandbox(t)
	archive := makeTarGz(t,
		file("common/vars.tf", "variable \"x\" {}"),
		symlink("modules/net/vars.tf", "../../common/vars.tf"),
		symlink("shared", "common"),
		entry{hdr: tar.Header{Name: "bin/run.sh", Typeflag: tar.TypeReg, Mode: 0o700, Size: 2}, body: []byte("#!")},
	)
	if err := Extract(bytes.NewReader(archive), s.dest, Limits{}); err != nil {
		t.Fatal(err)
	}
	s.assertContained(t)
	if b, err := os.ReadFile(filepath.Join(s.dest, "modules", "net", "vars.tf")); err != nil || string(b) != "variable \"x\" {}" {
		t.Fatalf("symlinked file: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.dest, "shared", "vars.tf")); err != nil || string(b) != "variable \"x\" {}" {
		t.Fatalf("symlinked directory: %q %v", b, err)
	}
	if info, err := os.Stat(filepath.Join(s.dest, "bin", "run.sh")); err != nil || info.Mode().Perm() != 0o755 {
		t.Fatalf("executable file: %v %v", info, err)
	}
}

func TestExtractNeverReplacesExistingFiles(t *testing.T) {
	s := newSandbox(t)
	if err := os.MkdirAll(filepath.Join(s.dest, "modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dest, "main.tf"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	archive := makeTarGz(t, file("modules/new.tf", "x"), file("main.tf", "theirs"))
	err := Extract(bytes.NewReader(archive), s.dest, Limits{})
	if err == nil || !strings.Contains(err.Error(), `entry "main.tf": main.tf already exists`) {
		t.Fatalf("want an already-exists error, got %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.dest, "main.tf")); string(b) != "mine" {
		t.Fatalf("existing file replaced: %q", b)
	}
	// What was there before stays; what this extraction added is undone.
	if got := listTree(t, s.dest); strings.Join(got, ",") != "main.tf,modules/" {
		t.Fatalf("dest after failed extraction: %v", got)
	}
}

func TestExtractVerifiedChecksTheDigestBeforeWriting(t *testing.T) {
	data, digest, err := Build(sampleFiles())
	if err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t)
	other := Digest([]byte("something else"))
	err = ExtractVerified(bytes.NewReader(data), other, s.dest, Limits{TempDir: s.base})
	var mismatch *DigestMismatchError
	if !errors.As(err, &mismatch) || mismatch.Got != digest {
		t.Fatalf("want a digest mismatch naming %s, got %v", digest, err)
	}
	if _, err := os.Stat(s.dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dest was created before the digest was checked: %v", err)
	}
	s.assertContained(t)

	if err := ExtractVerified(bytes.NewReader(data), digest, s.dest, Limits{TempDir: s.base}); err != nil {
		t.Fatal(err)
	}
	s.assertContained(t)
	if got := listTree(t, s.dest); len(got) != 13 {
		t.Fatalf("extracted %d entries: %v", len(got), got)
	}
	// The spool file is gone.
	if got := listTree(t, s.base); len(got) != 2+1+13 {
		t.Fatalf("base holds more than dest and outside: %v", got)
	}
}

func TestExtractVerifiedBoundsTheCompressedStream(t *testing.T) {
	data, digest, err := Build(sampleFiles())
	if err != nil {
		t.Fatal(err)
	}
	s := newSandbox(t)
	err = ExtractVerified(bytes.NewReader(data), digest, s.dest, Limits{MaxCompressedSize: 100, TempDir: s.base})
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("want a limit error, got %v", err)
	}
	if _, err := os.Stat(s.dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dest was created for an oversize archive: %v", err)
	}
}
