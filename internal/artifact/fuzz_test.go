package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/fuzzcorpus"
)

// fuzzLimits are small so the fuzzer reaches every limit quickly.
var fuzzLimits = Limits{MaxCompressedSize: 1 << 20, MaxUncompressedSize: 1 << 20, MaxFileSize: 256 << 10, MaxEntries: 64}

// FuzzExtract feeds arbitrary bytes to Extract. Whatever the input, nothing
// may appear outside dest; a failed extraction leaves dest empty; a
// successful one holds only regular files, directories and symlinks that
// resolve inside dest, within the limits, and every file holds exactly the
// bytes the archive gives it.
func FuzzExtract(f *testing.F) {
	f.Fuzz(func(t *testing.T, archive []byte) {
		s := newSandbox(t)
		err := Extract(bytes.NewReader(archive), s.dest, fuzzLimits)
		s.assertContained(t)
		if err != nil {
			if left := listTree(t, s.dest); len(left) != 0 {
				t.Fatalf("failed extraction (%v) left entries: %v", err, left)
			}
			return
		}
		assertOnlySafeTypes(t, s.dest)
		assertFilesMatchArchive(t, s.dest, archive)
	})
}

// assertOnlySafeTypes fails on anything under dest but regular files,
// directories and symlinks that resolve inside dest.
func assertOnlySafeTypes(t *testing.T, dest string) {
	t.Helper()
	destReal, err := filepath.EvalSymlinks(dest)
	if err != nil {
		t.Fatal(err)
	}
	walkErr := filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
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
}

// assertFilesMatchArchive reads the archive again, independently, and checks
// the limits held and each regular file was written byte for byte.
func assertFilesMatchArchive(t *testing.T, dest string, archive []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatalf("extracted an archive that is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	entries, total := 0, int64(0)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("extracted an archive tar cannot read: %v", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		entries++
		if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA {
			continue
		}
		total += hdr.Size
		want, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		got, err := os.ReadFile(filepath.Join(dest, filepath.FromSlash(name)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("entry %q: %d bytes on disk (%v), want the archive's %d", hdr.Name, len(got), err, len(want))
		}
	}
	if entries > fuzzLimits.MaxEntries || total > fuzzLimits.MaxUncompressedSize {
		t.Fatalf("extracted %d entries and %d bytes, over the limits %+v", entries, total, fuzzLimits)
	}
}

// FuzzExtractEntries builds a well-formed archive from a small text program
// (so the fuzzer explores names, types and link targets rather than gzip
// checksums) and compares Extract with what the archive must give:
//
//	f <name> <content>   regular file      x <name> <content>  executable file
//	d <name>             directory         l <name> <target>   symlink
//	h <name> <target>    hard link         c, b, p <name>      devices, FIFO
//
// any other letter is used as the tar type flag itself. An archive with a
// hard link, a device, a FIFO or an unknown type, an absolute name or a ".."
// segment, a symlink whose target leaves the root, or more than the entry
// and size limits must be refused and leave dest empty. An accepted one must
// hold each file with its content and mode, and nothing outside dest.
func FuzzExtractEntries(f *testing.F) {
	limits := Limits{MaxEntries: 16, MaxFileSize: 64, MaxUncompressedSize: 256}
	f.Fuzz(func(t *testing.T, program string) {
		entries := parseEntryProgram(program)
		archive, ok := buildEntries(entries)
		if !ok {
			return // tar cannot write it: nothing to extract
		}
		s := newSandbox(t)
		err := Extract(bytes.NewReader(archive), s.dest, limits)
		s.assertContained(t)
		if reason := mustRefuse(entries, limits); reason != "" && err == nil {
			t.Fatalf("accepted an archive with %s: %v", reason, listTree(t, s.dest))
		}
		if err != nil {
			if left := listTree(t, s.dest); len(left) != 0 {
				t.Fatalf("failed extraction (%v) left entries: %v", err, left)
			}
			return
		}
		assertOnlySafeTypes(t, s.dest)
		for _, e := range entries {
			if e.typ != 'f' && e.typ != 'x' {
				continue
			}
			p := filepath.Join(s.dest, filepath.FromSlash(strings.TrimPrefix(e.name, "./")))
			got, err := os.ReadFile(p)
			if err != nil || string(got) != e.arg {
				t.Fatalf("file %q: %q (%v), want %q", e.name, got, err, e.arg)
			}
			info, err := os.Stat(p)
			if want := os.FileMode(0o644) | os.FileMode(0o111)*boolMode(e.typ == 'x'); err != nil || info.Mode().Perm() != want {
				t.Fatalf("file %q: mode %v (%v), want %v", e.name, info.Mode(), err, want)
			}
		}
	})
}

func boolMode(b bool) os.FileMode {
	if b {
		return 1
	}
	return 0
}

type programEntry struct {
	typ       byte
	name, arg string
}

func parseEntryProgram(program string) []programEntry {
	var out []programEntry
	for _, line := range strings.Split(program, "\n") {
		if line == "" {
			continue
		}
		fields := strings.SplitN(line, " ", 3)
		if fields[0] == "" {
			continue // a line starting with a space has no type
		}
		e := programEntry{typ: fields[0][0]}
		if len(fields) > 1 {
			e.name = fields[1]
		}
		if len(fields) > 2 {
			e.arg = fields[2]
		}
		out = append(out, e)
	}
	return out
}

func buildEntries(entries []programEntry) ([]byte, bool) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		hdr := tar.Header{Name: e.name, Mode: 0o644, Typeflag: e.typ}
		var body []byte
		switch e.typ {
		case 'f', 'x':
			hdr.Typeflag, body, hdr.Size = tar.TypeReg, []byte(e.arg), int64(len(e.arg))
			if e.typ == 'x' {
				hdr.Mode = 0o755
			}
		case 'd':
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		case 'l':
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.arg
		case 'h':
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, e.arg
		case 'c':
			hdr.Typeflag = tar.TypeChar
		case 'b':
			hdr.Typeflag = tar.TypeBlock
		case 'p':
			hdr.Typeflag = tar.TypeFifo
		}
		if tw.WriteHeader(&hdr) != nil {
			return nil, false
		}
		if _, err := tw.Write(body); err != nil {
			return nil, false
		}
	}
	if tw.Close() != nil || zw.Close() != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// mustRefuse names a reason the archive of entries has to be refused, or "".
// It is a sufficient condition only: Extract refuses more (duplicates,
// dangling links, names in the way, other types).
func mustRefuse(entries []programEntry, limits Limits) string {
	if len(entries) > limits.MaxEntries {
		return fmt.Sprintf("%d entries", len(entries))
	}
	var total int64
	for _, e := range entries {
		name := strings.TrimPrefix(e.name, "./")
		switch e.typ {
		case 'f', 'x':
			total += int64(len(e.arg))
			if int64(len(e.arg)) > limits.MaxFileSize {
				return fmt.Sprintf("file %q over the size limit", e.name)
			}
		case 'l':
			if strings.HasPrefix(e.arg, "/") {
				return fmt.Sprintf("symlink %q to the absolute %q", e.name, e.arg)
			}
			if p := path.Join(path.Dir(name), e.arg); p == ".." || strings.HasPrefix(p, "../") {
				return fmt.Sprintf("symlink %q to %q outside the root", e.name, e.arg)
			}
		case 'h', 'c', 'b', 'p', tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo, tar.TypeCont:
			return fmt.Sprintf("entry %q of type %q", e.name, string(e.typ))
		case 'd', tar.TypeDir, tar.TypeReg, tar.TypeRegA:
			// "/" and "./" as directories name the root itself (tar reads
			// an old-style file whose name ends in "/" as a directory).
			name = strings.TrimSuffix(name, "/")
		default:
			continue // no claim about other types
		}
		if strings.HasPrefix(name, "/") || slices.Contains(strings.Split(name, "/"), "..") {
			return fmt.Sprintf("name %q leaving the root", e.name)
		}
	}
	if total > limits.MaxUncompressedSize {
		return fmt.Sprintf("%d bytes of files", total)
	}
	return ""
}

func TestFuzzExtractSeedsAreCheckedIn(t *testing.T) {
	var raw []fuzzcorpus.Seed
	for _, tc := range hostileArchives(t) {
		if len(tc.archive) < 64<<10 { // keep the corpus small; the table test has the big ones
			raw = append(raw, fuzzcorpus.Seed{Name: seedName(tc.name), Args: []any{tc.archive}})
		}
	}
	valid, _, err := Build(sampleFiles())
	if err != nil {
		t.Fatal(err)
	}
	var many []entry
	for i := range fuzzLimits.MaxEntries + 1 {
		many = append(many, file(fmt.Sprintf("f%03d.tf", i), ""))
	}
	raw = append(raw,
		fuzzcorpus.Seed{Name: "valid-program", Args: []any{valid}},
		fuzzcorpus.Seed{Name: "symlinks-inside", Args: []any{makeTarGz(t, file("common/vars.tf", "x"), symlink("modules/vars.tf", "../common/vars.tf"), symlink("shared", "common"))}},
		fuzzcorpus.Seed{Name: "entries-over-limit", Args: []any{makeTarGz(t, many...)}},
		fuzzcorpus.Seed{Name: "dot-slash-names", Args: []any{makeTarGz(t, dir("./"), dir("./a/"), file("./a/b.tf", "x"))}},
		fuzzcorpus.Seed{Name: "empty", Args: []any{[]byte{}}},
	)
	fuzzcorpus.Check(t, "FuzzExtract", raw)

	program := func(name string, lines ...string) fuzzcorpus.Seed {
		return fuzzcorpus.Seed{Name: name, Args: []any{strings.Join(lines, "\n")}}
	}
	var manyLines []string
	for i := range 17 {
		manyLines = append(manyLines, fmt.Sprintf("f e%02d.tf", i))
	}
	fuzzcorpus.Check(t, "FuzzExtractEntries", []fuzzcorpus.Seed{
		program("module", "d modules/", "f main.tf module \"net\" { source = \"./modules/net\" }", "f modules/net/main.tf output \"x\" { value = 1 }", "x bin/run.sh #!/bin/sh"),
		program("symlinks-inside", "f common/vars.tf variable \"x\" {}", "l modules/vars.tf ../common/vars.tf", "l shared common"),
		program("absolute-name", "f /etc/evil x"),
		program("dot-dot-name", "f a/../../outside/evil x"),
		program("dot-slash-dot-dot", "f ./../evil x"),
		program("symlink-out", "l up ../outside"),
		program("symlink-absolute", "l etc /etc"),
		program("symlink-chain-out", "d d/", "l d/up ..", "l y d/up/../outside"),
		program("write-through-symlink", "d sub/", "l l sub", "f l/evil.tf x"),
		program("symlink-then-file", "l a sub", "d sub/", "f a/x.tf x"),
		program("hardlink-out", "h h ../outside/sentinel"),
		program("hardlink-in", "f a.tf x", "h b.tf a.tf"),
		program("char-device", "c null"),
		program("block-device", "b sda"),
		program("fifo", "p pipe"),
		program("unknown-type", "7 contiguous"),
		program("duplicate", "f a.tf x", "f a.tf y"),
		program("file-over-limit", "f big.tf "+strings.Repeat("x", 65)),
		program("total-over-limit", "f a "+strings.Repeat("x", 60), "f b "+strings.Repeat("x", 60), "f c "+strings.Repeat("x", 60), "f d "+strings.Repeat("x", 60), "f e "+strings.Repeat("x", 60)),
		program("entries-over-limit", manyLines...),
		program("dir-over-file", "f a x", "d a/"),
		program("file-under-file", "f a x", "f a/b y"),
		program("backslash", "f a\\..\\evil x"),
		program("nul", "f a\x00b x"),
	})
}

func seedName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
}
