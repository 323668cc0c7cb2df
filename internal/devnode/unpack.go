package devnode

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Limits of one unpacked image: an image larger than this is refused
// rather than allowed to fill the disk.
const (
	maxImageBytes   = 8 << 30
	maxImageEntries = 1 << 20
)

// OCI whiteouts: ".wh.name" deletes name from the layers below,
// ".wh..wh..opq" empties its directory of what the layers below put there.
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// unpackLayers applies the layers, lowest first, to the directory rootfs.
// Every file operation goes through an os.Root, which refuses any path,
// symbolic or hard link that resolves outside rootfs, so a hostile layer
// cannot write to the host. Device files are skipped (devnode runs
// unprivileged programs; a kubelet's runtime would create them), owners
// are not applied, and set-id bits are dropped.
func unpackLayers(rootfs string, layers []v1.Layer) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("failed to open %s: %w", rootfs, err)
	}
	defer func() { _ = root.Close() }()
	budget := &unpackBudget{bytes: maxImageBytes, entries: maxImageEntries}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("failed to read layer %d: %w", i, err)
		}
		err = unpackLayer(root, tar.NewReader(rc), budget)
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

type unpackBudget struct{ bytes, entries int64 }

func unpackLayer(root *os.Root, tr *tar.Reader, budget *unpackBudget) error {
	// Entries of this layer survive an opaque whiteout in the same layer.
	written := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failed to read the archive: %w", err)
		}
		if budget.entries--; budget.entries < 0 {
			return fmt.Errorf("more than %d entries: refusing the image", maxImageEntries)
		}
		name, err := entryPath(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" {
			dir = "."
		}
		switch {
		case base == opaqueWhiteout:
			if err := emptyDir(root, dir, written); err != nil {
				return err
			}
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			if err := root.RemoveAll(path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))); err != nil {
				return fmt.Errorf("failed to apply whiteout %s: %w", hdr.Name, err)
			}
			continue
		}
		if err := unpackEntry(root, tr, hdr, name, budget); err != nil {
			return err
		}
		written[name] = true
	}
}

// entryPath turns an archive name into a path relative to the root,
// refusing one that climbs out of it.
func entryPath(name string) (string, error) {
	clean := path.Clean(strings.TrimLeft(name, "/"))
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("entry %q leaves the image's root: refusing the image", name)
	}
	return clean, nil
}

func unpackEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, budget *unpackBudget) error {
	mode := fs.FileMode(hdr.Mode).Perm()
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if parent := path.Dir(name); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("failed to create %s: %w", parent, err)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		// A later layer replaces what an earlier one put here.
		if err := root.RemoveAll(name); err != nil {
			return fmt.Errorf("failed to replace %s: %w", name, err)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if info, err := root.Lstat(name); err == nil && !info.IsDir() {
			if err := root.Remove(name); err != nil {
				return fmt.Errorf("failed to replace %s: %w", name, err)
			}
		}
		if err := root.MkdirAll(name, 0o755); err != nil {
			return fmt.Errorf("failed to create %s: %w", name, err)
		}
		return root.Chmod(name, mode|fs.ModeDir)
	case tar.TypeReg:
		if budget.bytes -= hdr.Size; budget.bytes < 0 {
			return fmt.Errorf("more than %d bytes: refusing the image", int64(maxImageBytes))
		}
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("failed to create %s: %w", name, err)
		}
		_, err = io.CopyN(f, tr, hdr.Size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("failed to write %s: %w", name, err)
		}
		return root.Chmod(name, mode)
	case tar.TypeSymlink:
		// The target is not resolved now; later operations through root
		// refuse to follow it out of the root.
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return fmt.Errorf("failed to create symbolic link %s: %w", name, err)
		}
		return nil
	case tar.TypeLink:
		target, err := entryPath(hdr.Linkname)
		if err != nil {
			return err
		}
		if err := root.Link(target, name); err != nil {
			return fmt.Errorf("failed to link %s to %s: %w", name, hdr.Linkname, err)
		}
		return nil
	default:
		return nil // devices and FIFOs: not for an unprivileged process
	}
}

// emptyDir removes what lower layers put in dir, keeping this layer's
// entries.
func emptyDir(root *os.Root, dir string, keep map[string]bool) error {
	f, err := root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to open %s: %w", dir, err)
	}
	entries, err := f.ReadDir(-1)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("failed to list %s: %w", dir, err)
	}
	for _, e := range entries {
		child := path.Join(dir, e.Name())
		if keep[child] {
			continue
		}
		if err := root.RemoveAll(child); err != nil {
			return fmt.Errorf("failed to apply opaque whiteout in %s: %w", dir, err)
		}
	}
	return nil
}
