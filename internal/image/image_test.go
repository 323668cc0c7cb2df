package image

import (
	"archive/tar"
	"compress/gzip"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fakeBinaries writes stand-ins for terrace, terrace-runner and tofu of one platform.
func fakeBinaries(t *testing.T, dir, arch string) Platform {
	t.Helper()
	p := Platform{OS: "linux", Architecture: arch, Terrace: filepath.Join(dir, arch+"-terrace"), Tofu: filepath.Join(dir, arch+"-tofu"), Runner: filepath.Join(dir, arch+"-terrace-runner")}
	for _, f := range []string{p.Terrace, p.Tofu, p.Runner} {
		if err := os.WriteFile(f, []byte("#!/bin/false\n"+f+"\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		// The host's times and modes must not reach the image.
		if err := os.Chtimes(f, time.Now(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func testOptions(t *testing.T, dir string) Options {
	return Options{
		Platforms: []Platform{fakeBinaries(t, dir, "amd64"), fakeBinaries(t, dir, "arm64")},
		Source:    "https://github.com/terrace-dev/terrace",
		Revision:  "0123abc",
		Version:   "v0.1.0",
		Created:   time.Unix(1700000000, 0),
	}
}

func indexDigest(t *testing.T, opts Options) v1.Hash {
	t.Helper()
	idx, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSameInputsGiveTheSameDigest(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir)
	first := indexDigest(t, opts)

	// Rewritten with other times and modes: same contents, same digest.
	for _, p := range opts.Platforms {
		data, _ := os.ReadFile(p.Terrace)
		if err := os.Remove(p.Terrace); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.Terrace, data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p.Terrace, time.Unix(1, 0), time.Unix(1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if again := indexDigest(t, opts); again != first {
		t.Fatalf("the same inputs gave %s, then %s", first, again)
	}

	changed := opts
	changed.Revision = "fedcba9"
	if d := indexDigest(t, changed); d == first {
		t.Fatal("another revision label gave the same digest")
	}
	if err := os.WriteFile(opts.Platforms[1].Terrace, []byte("another build"), 0o755); err != nil {
		t.Fatal(err)
	}
	if d := indexDigest(t, opts); d == first {
		t.Fatal("another arm64 terrace binary gave the same digest")
	}
}

func TestIndexHasOneImagePerPlatformRunningTerraceAsNonRoot(t *testing.T) {
	opts := testOptions(t, t.TempDir())
	idx, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := idx.MediaType(); mt != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", mt, types.OCIImageIndex)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, desc := range m.Manifests {
		platforms = append(platforms, desc.Platform.OS+"/"+desc.Platform.Architecture)
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != desc.Platform.OS || cfg.Architecture != desc.Platform.Architecture {
			t.Errorf("config says %s/%s under the %s/%s descriptor", cfg.OS, cfg.Architecture, desc.Platform.OS, desc.Platform.Architecture)
		}
		c := cfg.Config
		if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/usr/local/bin/terrace" || len(c.Cmd) != 0 {
			t.Errorf("entrypoint %q cmd %q, want [/usr/local/bin/terrace] and none", c.Entrypoint, c.Cmd)
		}
		if c.User != "65532:65532" || c.WorkingDir != "/workspace" {
			t.Errorf("user %q workdir %q, want 65532:65532 and /workspace", c.User, c.WorkingDir)
		}
		for k, want := range map[string]string{LabelSource: opts.Source, LabelRevision: opts.Revision, LabelVersion: opts.Version} {
			if c.Labels[k] != want {
				t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
			}
		}
		if !cfg.Created.Time.Equal(opts.Created) {
			t.Errorf("created %s, want %s", cfg.Created.Time, opts.Created)
		}
		checkFiles(t, img, desc.Platform.Architecture)
	}
	if len(platforms) != 2 || platforms[0] != "linux/amd64" || platforms[1] != "linux/arm64" {
		t.Errorf("platforms %v, want [linux/amd64 linux/arm64]", platforms)
	}
}

// checkFiles reads every layer and checks owners, modes, times and the
// binaries of the image's platform.
func checkFiles(t *testing.T, img v1.Image, arch string) {
	t.Helper()
	headers, contents := readFiles(t, img)
	want := map[string]struct {
		mode int64
		uid  int
	}{
		"tmp/":                              {0o1777, 0},
		"workspace/":                        {0o755, UID},
		"home/nonroot/":                     {0o700, UID},
		"usr/local/bin/terrace":             {0o755, 0},
		"usr/local/bin/terrace-runner":      {0o755, 0},
		"usr/local/bin/tofu":                {0o755, 0},
		"etc/ssl/certs/ca-certificates.crt": {0o644, 0},
		"etc/passwd":                        {0o644, 0},
	}
	for name, w := range want {
		hdr := headers[name]
		if hdr == nil {
			t.Errorf("%s is missing from the image", name)
			continue
		}
		if hdr.Mode != w.mode || hdr.Uid != w.uid || hdr.Gid != w.uid {
			t.Errorf("%s: mode %o owner %d:%d, want %o %d:%d", name, hdr.Mode, hdr.Uid, hdr.Gid, w.mode, w.uid, w.uid)
		}
	}
	for _, bin := range []string{"terrace", "terrace-runner"} {
		if got := string(contents["usr/local/bin/"+bin]); !strings.HasSuffix(strings.TrimSpace(got), "/"+arch+"-"+bin) {
			t.Errorf("the %s image holds %s %q", arch, bin, got)
		}
	}
	certs, rest := 0, contents["etc/ssl/certs/ca-certificates.crt"]
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("CA bundle: %v", err)
		}
		certs++
	}
	if certs < 100 {
		t.Errorf("the CA bundle holds %d certificates, want the Mozilla roots", certs)
	}
}

// readFiles reads every layer of img: the headers and contents by name.
func readFiles(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	headers := map[string]*tar.Header{}
	contents := map[string][]byte{}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !hdr.ModTime.Equal(time.Unix(1700000000, 0)) || hdr.Uname != "" || hdr.Gname != "" {
				t.Errorf("%s: time %s owner names %q/%q, want the build's time and no names", hdr.Name, hdr.ModTime, hdr.Uname, hdr.Gname)
			}
			headers[hdr.Name] = hdr
			contents[hdr.Name], _ = io.ReadAll(tr)
		}
		_ = rc.Close()
	}
	return headers, contents
}

// An image built from a terrace binary alone (`terrace dev` with no
// terrace-runner beside it) links terrace-runner to terrace, which then
// behaves as the runner.
func TestWithoutTheRunnerBinaryTheImageLinksItToTerrace(t *testing.T) {
	p := fakeBinaries(t, t.TempDir(), "amd64")
	p.Runner = ""
	img, err := BuildImage(Options{Created: time.Unix(1700000000, 0)}, p)
	if err != nil {
		t.Fatal(err)
	}
	headers, _ := readFiles(t, img)
	hdr := headers["usr/local/bin/terrace-runner"]
	if hdr == nil || hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != "terrace" {
		t.Fatalf("terrace-runner is %+v, want a link to terrace beside it", hdr)
	}
}

func TestBuildRefusesMissingBinaries(t *testing.T) {
	opts := testOptions(t, t.TempDir())
	opts.Platforms[1].Tofu = filepath.Join(t.TempDir(), "missing-tofu")
	_, err := Build(opts)
	if err == nil {
		t.Fatal("built an image without its tofu binary")
	}
	t.Log(err)
	if _, err := Build(Options{}); err == nil {
		t.Fatal("built an image of no platform")
	}
	// Without terrace-runner (linked to terrace), terrace is still required.
	p := fakeBinaries(t, t.TempDir(), "amd64")
	p.Runner, p.Terrace = "", ""
	if _, err := BuildImage(Options{}, p); err == nil {
		t.Fatal("built an image without its terrace binary")
	}
}

func TestFastCompressionKeepsTheSameFiles(t *testing.T) {
	opts := testOptions(t, t.TempDir())
	slow, err := BuildImage(opts, opts.Platforms[0])
	if err != nil {
		t.Fatal(err)
	}
	opts.CompressionLevel = gzip.BestSpeed
	fast, err := BuildImage(opts, opts.Platforms[0])
	if err != nil {
		t.Fatal(err)
	}
	opts.CompressionLevel = Uncompressed
	plain, err := BuildImage(opts, opts.Platforms[0])
	if err != nil {
		t.Fatal(err)
	}
	c, _ := plain.ConfigFile()
	layers, _ := plain.Layers()
	if mt, _ := layers[0].MediaType(); mt != types.OCIUncompressedLayer {
		t.Errorf("uncompressed layer media type %s", mt)
	}
	// The uncompressed layers (diff ids) are what a runtime unpacks.
	a, _ := slow.ConfigFile()
	b, _ := fast.ConfigFile()
	if len(a.RootFS.DiffIDs) != 3 || len(b.RootFS.DiffIDs) != 3 {
		t.Fatalf("diff ids %v and %v, want three layers", a.RootFS.DiffIDs, b.RootFS.DiffIDs)
	}
	for i := range a.RootFS.DiffIDs {
		if a.RootFS.DiffIDs[i] != b.RootFS.DiffIDs[i] || a.RootFS.DiffIDs[i] != c.RootFS.DiffIDs[i] {
			t.Errorf("layer %d differs in content with another compression level", i)
		}
	}
}
