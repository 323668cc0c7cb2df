package image

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// A layer of chosen files has them where they were asked for, with the
// modes, owners and links given, their parents as root's directories, and
// the same digest when built twice.
func TestFilesLayer(t *testing.T) {
	host := filepath.Join(t.TempDir(), "git")
	if err := os.WriteFile(host, []byte("git binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	files := []File{
		{Path: "/usr/lib/git-core/git", HostPath: host, Mode: 0o755},
		{Path: "usr/bin/git", LinkTo: "../lib/git-core/git"},
		{Path: "/etc/app.ini", Data: []byte("[server]\n")},
		{Path: "/data", Dir: true, UID: 65532, GID: 65532},
	}
	created := time.Unix(1700000000, 0)
	layer, err := FilesLayer(files, created, DefaultCompression)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	headers, contents := readFiles(t, img)
	if h := headers["usr/lib/git-core/git"]; h == nil || h.Mode != 0o755 || h.Uid != 0 || string(contents["usr/lib/git-core/git"]) != "git binary" {
		t.Errorf("/usr/lib/git-core/git: %+v %q", h, contents["usr/lib/git-core/git"])
	}
	if h := headers["usr/bin/git"]; h == nil || h.Linkname != "../lib/git-core/git" || h.Mode != 0o777 {
		t.Errorf("/usr/bin/git: %+v", h)
	}
	if h := headers["etc/app.ini"]; h == nil || h.Mode != 0o644 || string(contents["etc/app.ini"]) != "[server]\n" {
		t.Errorf("/etc/app.ini: %+v %q", h, contents["etc/app.ini"])
	}
	if h := headers["data/"]; h == nil || h.Mode != 0o755 || h.Uid != 65532 || h.Gid != 65532 {
		t.Errorf("/data: %+v", h)
	}
	if h := headers["usr/lib/"]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
		t.Errorf("/usr/lib, a parent no file names: %+v", h)
	}
	again, err := FilesLayer(files, created, DefaultCompression)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := layer.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("the same files gave two digests: %s and %s", d1, d2)
	}

	if _, err := FilesLayer([]File{{Path: "/a", Data: []byte("1")}, {Path: "a", Data: []byte("2")}}, created, DefaultCompression); err == nil {
		t.Error("a path named twice was accepted")
	}
	if _, err := FilesLayer([]File{{Path: "/"}}, created, DefaultCompression); err == nil {
		t.Error("an empty path was accepted")
	}
}
