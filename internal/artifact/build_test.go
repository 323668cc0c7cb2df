package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strings"
	"testing"
)

func sampleFiles() map[string][]byte {
	return map[string][]byte{
		"main.tf":                 []byte("module \"net\" {\n  source = \"./modules/net\"\n}\n"),
		"variables.tf":            []byte("variable \"name\" {}\n"),
		"modules/net/main.tf":     []byte("resource \"terraform_data\" \"x\" {}\n"),
		"modules/net/outputs.tf":  []byte("output \"id\" { value = 1 }\n"),
		"modules/net-extra/a.tf":  []byte("locals {}\n"),
		"templates/user-data.tpl": []byte("#!/bin/sh\necho ${name}\n"),
		"z.tf.json":               []byte(`{"locals":{"a":1}}`),
		strings.Repeat("d", 90) + "/" + strings.Repeat("f", 60) + ".tf": []byte("# long name needs PAX\n"),
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	first, firstDigest, err := Build(sampleFiles())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ { // map iteration order differs between calls
		data, digest, err := Build(sampleFiles())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, data) || digest != firstDigest {
			t.Fatalf("build %d differs: digest %s, first %s", i, digest, firstDigest)
		}
	}
	if firstDigest != Digest(first) {
		t.Fatalf("returned digest %s is not the digest of the bytes %s", firstDigest, Digest(first))
	}
}

// TestBuildDigestIsStable pins the digest of a fixed file set, so a change to
// the archive layout (or to the compressor, with a new Go release) is seen
// here rather than as every Program's revision changing in clusters.
func TestBuildDigestIsStable(t *testing.T) {
	_, digest, err := Build(map[string][]byte{
		"main.tf":             []byte("output \"hello\" { value = \"world\" }\n"),
		"modules/net/main.tf": []byte("locals { cidr = \"10.0.0.0/16\" }\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	const want = "sha256:c5c805cba71fcca6c92d3ca627ddd2267aa779d8731596647a463a56597f164f"
	if digest != want {
		t.Fatalf("digest of the pinned file set changed: got %s, want %s", digest, want)
	}
}

func TestBuildMetadataIsFixed(t *testing.T) {
	data, _, err := Build(sampleFiles())
	if err != nil {
		t.Fatal(err)
	}
	// gzip header: no flags (so no name or comment), mtime 0, OS unknown.
	if data[3] != 0 || !bytes.Equal(data[4:8], []byte{0, 0, 0, 0}) || data[9] != 255 {
		t.Fatalf("gzip header carries metadata: % x", data[:10])
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.ModTime.Unix() != 0 || hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" {
			t.Errorf("%s carries host metadata: mtime %v uid %d gid %d uname %q gname %q", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname)
		}
		wantMode := int64(0o644)
		if hdr.Typeflag == tar.TypeDir {
			wantMode = 0o755
		}
		if hdr.Mode != wantMode {
			t.Errorf("%s has mode %o, want %o", hdr.Name, hdr.Mode, wantMode)
		}
	}
	want := []string{
		strings.Repeat("d", 90) + "/",
		strings.Repeat("d", 90) + "/" + strings.Repeat("f", 60) + ".tf",
		"main.tf",
		"modules/",
		"modules/net-extra/",
		"modules/net-extra/a.tf",
		"modules/net/",
		"modules/net/main.tf",
		"modules/net/outputs.tf",
		"templates/",
		"templates/user-data.tpl",
		"variables.tf",
		"z.tf.json",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Fatalf("entries:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
}

func TestBuildRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "/etc/passwd", "../x.tf", "a/../b.tf", "a//b.tf", "./a.tf", "a/", "a\\b.tf", "a\x00b"} {
		if _, _, err := Build(map[string][]byte{name: []byte("x")}); err == nil {
			t.Errorf("Build accepted the name %q", name)
		}
	}
	if _, _, err := Build(map[string][]byte{"a": []byte("x"), "a/b.tf": []byte("y")}); err == nil {
		t.Error("Build accepted a name that is both a file and a directory")
	}
}

func TestVerifyDigest(t *testing.T) {
	data := []byte("hello")
	if err := VerifyDigest(data, Digest(data)); err != nil {
		t.Fatal(err)
	}
	var mismatch *DigestMismatchError
	if err := VerifyDigest([]byte("other"), Digest(data)); !errors.As(err, &mismatch) {
		t.Fatalf("want DigestMismatchError, got %v", err)
	}
	for _, bad := range []string{"", "sha256:", "md5:abc", "sha256:" + strings.Repeat("G", 64), "sha256:" + strings.Repeat("A", 64)} {
		if err := VerifyDigest(data, bad); err == nil {
			t.Errorf("accepted malformed digest %q", bad)
		}
	}
}
