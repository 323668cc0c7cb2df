package image

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A provider mirror and a shell go into layers of their own: the mirror's
// files readable by the image's user under ProviderMirrorDir (providers
// executable), busybox as /bin/busybox with /bin/sh linked to it.
func TestProviderMirrorAndShellLayers(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatalf("no /bin/busybox: run hack/install-deps.sh test (Debian's busybox-static), as make test does: %v", err)
	}
	dir := t.TempDir()
	p := fakeBinaries(t, dir, "amd64")
	p.ProviderMirror = filepath.Join(dir, "mirror")
	provider := filepath.Join(p.ProviderMirror, "registry.opentofu.org", "acme", "thing", "1.0.0", "linux_amd64", "terraform-provider-thing")
	if err := os.MkdirAll(filepath.Dir(provider), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(provider, []byte("provider"), 0o700); err != nil {
		t.Fatal(err)
	}
	p.Shell = "/bin/busybox"
	img, err := BuildImage(Options{Version: "v0.1.0", Created: time.Unix(1700000000, 0)}, p)
	if err != nil {
		t.Fatal(err)
	}
	headers, contents := readFiles(t, img)
	inImage := ProviderMirrorDir[1:] + "/registry.opentofu.org/acme/thing/1.0.0/linux_amd64/terraform-provider-thing"
	if h := headers[inImage]; h == nil || h.Mode != 0o755 || h.Uid != 0 || string(contents[inImage]) != "provider" {
		t.Errorf("provider in the image: %+v %q", h, contents[inImage])
	}
	if h := headers[ProviderMirrorDir[1:]+"/registry.opentofu.org/"]; h == nil || h.Mode != 0o755 {
		t.Errorf("mirror directory in the image: %+v", h)
	}
	if h := headers["bin/sh"]; h == nil || h.Linkname != "busybox" {
		t.Errorf("/bin/sh: %+v", h)
	}
	if h := headers["bin/busybox"]; h == nil || h.Mode != 0o755 || h.Size == 0 {
		t.Errorf("/bin/busybox: %+v", h)
	}
}
