package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file or directory of a layer. Owner, mode and time are fixed
// by the builder, never read from the host, so the layer's bytes depend only
// on the contents.
type entry struct {
	name     string // relative to "/", no leading slash
	dir      bool
	mode     int64
	uid, gid int
	data     []byte // regular file contents
	hostPath string // or a file on the host whose contents are streamed
	linkTo   string // or a symbolic link to this path, relative to the link's directory
}

// layerFiles is the content of one layer, written in sorted order.
type layerFiles []entry

// writeTar writes the entries as a tar archive sorted by name (parents
// before children), every header with the same time and no user or group
// names.
func (files layerFiles) writeTar(w io.Writer, modTime time.Time) error {
	sorted := append(layerFiles(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	tw := tar.NewWriter(w)
	for _, e := range sorted {
		if err := e.write(tw, modTime); err != nil {
			return err
		}
	}
	return tw.Close()
}

func (e entry) write(tw *tar.Writer, modTime time.Time) error {
	hdr := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: modTime, Format: tar.FormatPAX}
	var body io.Reader
	switch {
	case e.dir:
		hdr.Typeflag, hdr.Name = tar.TypeDir, strings.TrimSuffix(e.name, "/")+"/"
	case e.linkTo != "":
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.linkTo
	case e.hostPath != "":
		f, err := os.Open(e.hostPath)
		if err != nil {
			return fmt.Errorf("failed to open %s for /%s: %w", e.hostPath, e.name, err)
		}
		defer func() { _ = f.Close() }()
		info, err := f.Stat()
		if err != nil {
			return fmt.Errorf("failed to stat %s: %w", e.hostPath, err)
		}
		hdr.Typeflag, hdr.Size, body = tar.TypeReg, info.Size(), f
	default:
		hdr.Typeflag, hdr.Size, body = tar.TypeReg, int64(len(e.data)), bytes.NewReader(e.data)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("failed to write /%s: %w", e.name, err)
	}
	if body == nil {
		return nil
	}
	if n, err := io.Copy(tw, body); err != nil || n != hdr.Size {
		return fmt.Errorf("failed to write /%s (did the file change while being read?): %v", e.name, err)
	}
	return nil
}

// layer builds a gzip-compressed OCI layer from files. The uncompressed tar
// is kept in memory (the image's files are a few binaries), and the
// compressed bytes are cached so that writing and pushing compress once.
func (files layerFiles) layer(modTime time.Time, level int) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := files.writeTar(&buf, modTime); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	if level == Uncompressed {
		return static.NewLayer(raw, types.OCIUncompressedLayer), nil
	}
	return tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithCompressionLevel(level),
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressedCaching,
	)
}

// treeFiles lists the regular files and directories under the host
// directory root as entries under name, readable by everyone and owned by
// root; symbolic links are followed (a provider mirror may link to a build
// cache), anything else is refused.
func treeFiles(root, name string) (layerFiles, error) {
	var files layerFiles
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		target := path.Join(name, filepath.ToSlash(rel))
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			files = append(files, entry{name: target, dir: true, mode: 0o755})
		case info.Mode().IsRegular():
			mode := int64(0o644)
			if info.Mode().Perm()&0o111 != 0 {
				mode = 0o755 // executable by the image's user, whoever owned it here
			}
			files = append(files, entry{name: target, mode: mode, hostPath: p})
		default:
			return fmt.Errorf("%s is neither a file nor a directory", p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", root, err)
	}
	return files, nil
}

// shellFiles are /bin/busybox from the host's static busybox and a link in
// /bin for each command it lists (sh among them).
func shellFiles(busybox string) (layerFiles, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("failed to list the commands of %s: %w", busybox, err)
	}
	files := layerFiles{{name: "bin/busybox", mode: 0o755, hostPath: busybox}}
	for _, cmd := range strings.Fields(string(out)) {
		if cmd != "busybox" && !strings.Contains(cmd, "/") {
			files = append(files, entry{name: "bin/" + cmd, mode: 0o777, linkTo: "busybox"})
		}
	}
	if len(files) < 2 {
		return nil, fmt.Errorf("%s lists no commands", busybox)
	}
	return files, nil
}

// withParents adds the directories leading to each entry that no entry
// names, owned by root with mode 0755, as a real root filesystem has them.
func (files layerFiles) withParents() layerFiles {
	have := map[string]bool{}
	for _, e := range files {
		have[e.name] = true
	}
	out := append(layerFiles(nil), files...)
	for _, e := range files {
		for dir := path.Dir(e.name); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if !have[dir] {
				have[dir] = true
				out = append(out, entry{name: dir, dir: true, mode: 0o755})
			}
		}
	}
	return out
}

// DefaultCompression is the gzip level of `make image`: the digest depends
// on it, so it is fixed. Uncompressed layers (OCI's plain tar media type)
// suit an image that never leaves the machine, such as the dev cluster's:
// nothing to compress or decompress.
const (
	DefaultCompression = gzip.DefaultCompression
	Uncompressed       = gzip.HuffmanOnly - 1
)
