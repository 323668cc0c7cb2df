package devnode

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
)

// tarEntry is one archive member of a test layer.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func testLayer(t *testing.T, entries ...tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body))}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if hdr.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestUnpackAppliesLayersAndWhiteouts(t *testing.T) {
	rootfs := t.TempDir()
	lower := testLayer(t,
		tarEntry{name: "usr/local/bin/tool", body: "v1", mode: 0o755},
		tarEntry{name: "etc/gone", body: "x"},
		tarEntry{name: "data/", typ: tar.TypeDir, mode: 0o755},
		tarEntry{name: "data/old", body: "lower"},
		tarEntry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		tarEntry{name: "bin", typ: tar.TypeSymlink, link: "usr/local/bin"},
		tarEntry{name: "etc/hard", typ: tar.TypeLink, link: "usr/local/bin/tool"},
		tarEntry{name: "suid", body: "s", mode: 0o4755},
	)
	upper := testLayer(t,
		tarEntry{name: "./usr/local/bin/tool", body: "v2", mode: 0o755},
		tarEntry{name: "etc/.wh.gone", typ: tar.TypeReg},
		tarEntry{name: "data/new", body: "upper"},
		tarEntry{name: "data/.wh..wh..opq", typ: tar.TypeReg},
		tarEntry{name: "dev/null", typ: tar.TypeChar},
	)
	if err := unpackLayers(rootfs, []v1.Layer{lower, upper}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(rootfs, "bin/tool")); got != "v2" {
		t.Errorf("the upper layer's file reads %q through the symlink, want v2", got)
	}
	if got := readFile(t, filepath.Join(rootfs, "etc/hard")); got != "v1" {
		t.Errorf("the hard link reads %q, want the lower layer's v1", got)
	}
	for _, gone := range []string{"etc/gone", "data/old", "dev/null"} {
		if _, err := os.Lstat(filepath.Join(rootfs, gone)); !os.IsNotExist(err) {
			t.Errorf("%s exists after the upper layer (whiteout, opaque directory, device): %v", gone, err)
		}
	}
	if got := readFile(t, filepath.Join(rootfs, "data/new")); got != "upper" {
		t.Errorf("the opaque whiteout removed its own layer's file: %q", got)
	}
	if info, _ := os.Stat(filepath.Join(rootfs, "tmp")); info.Mode()&os.ModeSticky == 0 || info.Mode().Perm() != 0o777 {
		t.Errorf("/tmp has mode %s, want sticky and 0777", info.Mode())
	}
	if info, _ := os.Stat(filepath.Join(rootfs, "suid")); info.Mode()&os.ModeSetuid != 0 {
		t.Errorf("a set-uid bit survived: %s", info.Mode())
	}
}

func TestUnpackRefusesPathsLeavingTheRoot(t *testing.T) {
	cases := map[string][]tarEntry{
		"dot-dot":                   {{name: "../escape", body: "x"}},
		"dot-dot inside":            {{name: "a/../../escape", body: "x"}},
		"write through a symlink":   {{name: "link", typ: tar.TypeSymlink, link: "../.."}, {name: "link/escape", body: "x"}},
		"absolute symlink":          {{name: "etc", typ: tar.TypeSymlink, link: "/"}, {name: "etc/escape", body: "x"}},
		"hard link out":             {{name: "pw", typ: tar.TypeLink, link: "../../../etc/passwd"}},
		"hard link through symlink": {{name: "up", typ: tar.TypeSymlink, link: ".."}, {name: "pw", typ: tar.TypeLink, link: "up/outside"}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			if err := os.WriteFile(filepath.Join(parent, "outside"), []byte("host"), 0o644); err != nil {
				t.Fatal(err)
			}
			rootfs := filepath.Join(parent, "rootfs")
			if err := os.Mkdir(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			err := unpackLayers(rootfs, []v1.Layer{testLayer(t, entries...)})
			if err == nil {
				t.Fatal("the layer was unpacked")
			}
			t.Log(err)
			if _, err := os.Stat(filepath.Join(parent, "escape")); !os.IsNotExist(err) {
				t.Fatal("a file was written outside the root")
			}
			if got := readFile(t, filepath.Join(parent, "outside")); got != "host" {
				t.Fatalf("a host file changed: %q", got)
			}
		})
	}
}

func TestMirrorRootfsLinksTheImageAndHidesMounts(t *testing.T) {
	rootfs := t.TempDir()
	if err := unpackLayers(rootfs, []v1.Layer{testLayer(t,
		tarEntry{name: "usr/local/bin/terrace", body: "bin", mode: 0o755},
		tarEntry{name: "usr/bin/sh", typ: tar.TypeSymlink, link: "/usr/local/bin/terrace"},
		tarEntry{name: "etc/terrace/tls/old.pem", body: "image's"},
		tarEntry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
	)}); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := mirrorRootfs(rootfs, root, nil); err != nil {
		t.Fatal(err)
	}
	// Again, into a fresh root, with a volume mounted over /etc/terrace/tls.
	root = t.TempDir()
	if err := mirrorRootfs(rootfs, root, []corev1.VolumeMount{{MountPath: "/etc/terrace/tls"}}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "usr/bin/sh")); got != "bin" {
		t.Errorf("an absolute symlink of the image reads %q, want the image's file", got)
	}
	if target, _ := os.Readlink(filepath.Join(root, "usr/bin/sh")); !strings.HasPrefix(target, root) {
		t.Errorf("the absolute symlink points to %s, outside the container's root", target)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/terrace/tls")); !os.IsNotExist(err) {
		t.Errorf("the image's files under a mount path were laid out: %v", err)
	}
	// A restart finds the root as the container left it.
	if err := os.WriteFile(filepath.Join(root, "tmp/state"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := mirrorRootfs(rootfs, root, nil); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "tmp/state")); got != "kept" {
		t.Errorf("a second layout lost the container's file: %q", got)
	}
	if info, _ := os.Stat(filepath.Join(root, "tmp")); info.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp lost its sticky bit: %s", info.Mode())
	}
}
