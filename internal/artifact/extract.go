package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// Limits bound what Extract accepts. A zero field takes its default.
type Limits struct {
	// MaxCompressedSize bounds the tar.gz stream. Default 100 MiB.
	MaxCompressedSize int64
	// MaxUncompressedSize bounds the sum of all file contents. Default 512 MiB.
	MaxUncompressedSize int64
	// MaxFileSize bounds one file. Default 256 MiB.
	MaxFileSize int64
	// MaxEntries bounds the number of entries (files, directories, links). Default 10000.
	MaxEntries int
	// TempDir is where ExtractVerified spools the archive while it checks the
	// digest. Default os.TempDir().
	TempDir string
}

// Default limits.
const (
	DefaultMaxCompressedSize   = 100 << 20
	DefaultMaxUncompressedSize = 512 << 20
	DefaultMaxFileSize         = 256 << 20
	DefaultMaxEntries          = 10000
)

func (l Limits) withDefaults() Limits {
	if l.MaxCompressedSize <= 0 {
		l.MaxCompressedSize = DefaultMaxCompressedSize
	}
	if l.MaxUncompressedSize <= 0 {
		l.MaxUncompressedSize = DefaultMaxUncompressedSize
	}
	if l.MaxFileSize <= 0 {
		l.MaxFileSize = DefaultMaxFileSize
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l
}

// ErrLimitExceeded is wrapped by every error about an archive over a limit.
var ErrLimitExceeded = errors.New("archive limit exceeded")

// ErrUnsafeEntry is wrapped by every error about an entry that is refused
// for safety (path, link or type).
var ErrUnsafeEntry = errors.New("unsafe archive entry")

// ExtractVerified reads the tar.gz from r, checks that its digest is digest,
// and only then extracts it into dest. The stream is spooled to a temporary
// file (bounded by MaxCompressedSize), so nothing is written under dest for
// an archive with the wrong digest.
func ExtractVerified(r io.Reader, digest, dest string, limits Limits) error {
	if err := validateDigest(digest); err != nil {
		return err
	}
	limits = limits.withDefaults()
	spool, err := os.CreateTemp(limits.TempDir, "terrace-artifact-*.tar.gz")
	if err != nil {
		return fmt.Errorf("failed to create spool file: %w", err)
	}
	defer func() {
		_ = spool.Close()
		_ = os.Remove(spool.Name())
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(spool, h), io.LimitReader(r, limits.MaxCompressedSize+1))
	if err != nil {
		return fmt.Errorf("failed to read archive: %w", err)
	}
	if n > limits.MaxCompressedSize {
		return fmt.Errorf("%w: archive is larger than %d bytes", ErrLimitExceeded, limits.MaxCompressedSize)
	}
	if got := DigestPrefix + hex.EncodeToString(h.Sum(nil)); got != digest {
		return &DigestMismatchError{Want: digest, Got: got}
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("failed to rewind spool file: %w", err)
	}
	return Extract(spool, dest, limits)
}

// ExtractBytes verifies data against digest and extracts it into dest.
func ExtractBytes(data []byte, digest, dest string, limits Limits) error {
	if err := VerifyDigest(data, digest); err != nil {
		return err
	}
	return Extract(bytes.NewReader(data), dest, limits)
}

// Extract unpacks the tar.gz from r into dest, which is created if missing.
//
// It refuses, with an error naming the entry: absolute names, names with ".."
// or empty segments, hard links, symlinks with an absolute target or whose
// target does not resolve to an existing entry inside dest, device files,
// FIFOs and other special types, duplicate entries, entries that would
// replace something already in dest, and archives over limits. All writes go
// through an os.Root opened at dest, so no entry can reach outside dest even
// through a link. Symlinks are created after every file and directory, and
// each is then resolved inside the root, so a chain of relative links cannot
// lead out either. On error, every entry this call created is removed.
//
// Files are written 0644, or 0755 when the archive gives any execute bit;
// directories 0755. Owners and times from the archive are ignored.
func Extract(r io.Reader, dest string, limits Limits) (err error) {
	limits = limits.withDefaults()
	if err := os.MkdirAll(dest, dirMode); err != nil {
		return fmt.Errorf("failed to create destination %s: %w", dest, err)
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return fmt.Errorf("failed to open destination %s: %w", dest, err)
	}
	defer root.Close()

	x := &extraction{root: root, limits: limits, seen: map[string]bool{}}
	defer func() {
		if err != nil {
			x.removeCreated()
		}
	}()

	compressed := &limitedReader{r: r, limit: limits.MaxCompressedSize, what: "archive"}
	zr, err := gzip.NewReader(compressed)
	if err != nil {
		return fmt.Errorf("failed to read gzip header: %w", err)
	}
	defer zr.Close()
	// Headers, padding and skipped entry data also cost decompression work,
	// so the whole decompressed stream is bounded, not only file contents.
	decompressed := &limitedReader{
		r:     zr,
		limit: limits.MaxUncompressedSize + int64(limits.MaxEntries+2)*4096,
		what:  "decompressed archive",
	}
	tr := tar.NewReader(decompressed)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("failed to read archive after %d entries: %w", x.entries, err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	return x.finishSymlinks()
}

type pendingSymlink struct{ name, target string }

type extraction struct {
	root     *os.Root
	limits   Limits
	entries  int
	total    int64
	seen     map[string]bool
	created  []string // paths this extraction created, to undo on error
	symlinks []pendingSymlink
}

func (x *extraction) entry(hdr *tar.Header, body io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // PAX global headers carry metadata only
	}
	x.entries++
	if x.entries > x.limits.MaxEntries {
		return fmt.Errorf("%w: archive has more than %d entries", ErrLimitExceeded, x.limits.MaxEntries)
	}
	name := strings.TrimPrefix(hdr.Name, "./")
	if hdr.Typeflag == tar.TypeDir {
		name = strings.TrimSuffix(name, "/")
		if name == "" || name == "." {
			return nil // the root itself
		}
	}
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("%w: entry %q: %v", ErrUnsafeEntry, hdr.Name, err)
	}
	if x.seen[name] {
		return fmt.Errorf("%w: entry %q appears twice", ErrUnsafeEntry, hdr.Name)
	}
	x.seen[name] = true

	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.mkdirAll(name, hdr.Name)
	case tar.TypeReg, tar.TypeRegA:
		return x.writeFile(name, hdr, body)
	case tar.TypeSymlink:
		return x.addSymlink(name, hdr)
	case tar.TypeLink:
		return fmt.Errorf("%w: entry %q is a hard link (to %q); hard links are not allowed", ErrUnsafeEntry, hdr.Name, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("%w: entry %q is a device or FIFO; special files are not allowed", ErrUnsafeEntry, hdr.Name)
	default:
		return fmt.Errorf("%w: entry %q has unsupported type %q", ErrUnsafeEntry, hdr.Name, string(hdr.Typeflag))
	}
}

// noteCreated records a path this extraction is about to create, so that an
// error can undo it without touching what was in dest before.
func (x *extraction) noteCreated(name string) { x.created = append(x.created, name) }

// mkdirAll creates name and its parents inside the root. An existing
// directory is fine; anything else in the way is an error.
func (x *extraction) mkdirAll(name, entry string) error {
	segs := strings.Split(name, "/")
	for i := range segs {
		p := strings.Join(segs[:i+1], "/")
		info, err := x.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			x.noteCreated(p) // the first missing ancestor; MkdirAll creates the rest under it
			break
		}
		if err != nil {
			return fmt.Errorf("failed to inspect %s for entry %q: %w", p, entry, err)
		}
		if !info.IsDir() {
			return fmt.Errorf("%w: entry %q: %s already exists and is not a directory", ErrUnsafeEntry, entry, p)
		}
	}
	if err := x.root.MkdirAll(name, dirMode); err != nil {
		return fmt.Errorf("failed to create directory for entry %q: %w", entry, err)
	}
	return nil
}

func (x *extraction) writeFile(name string, hdr *tar.Header, body io.Reader) error {
	if hdr.Size < 0 || hdr.Size > x.limits.MaxFileSize {
		return fmt.Errorf("%w: entry %q is %d bytes, more than the %d allowed for one file", ErrLimitExceeded, hdr.Name, hdr.Size, x.limits.MaxFileSize)
	}
	if x.total+hdr.Size > x.limits.MaxUncompressedSize {
		return fmt.Errorf("%w: entry %q takes the archive past %d uncompressed bytes", ErrLimitExceeded, hdr.Name, x.limits.MaxUncompressedSize)
	}
	x.total += hdr.Size
	if dir := path.Dir(name); dir != "." {
		if err := x.mkdirAll(dir, hdr.Name); err != nil {
			return err
		}
	}
	mode := os.FileMode(fileMode)
	if hdr.Mode&0o111 != 0 {
		mode = dirMode
	}
	// O_EXCL: never replace or write through anything already there.
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: entry %q: %s already exists", ErrUnsafeEntry, hdr.Name, name)
		}
		return fmt.Errorf("failed to create file for entry %q: %w", hdr.Name, err)
	}
	x.noteCreated(name)
	n, err := io.Copy(f, io.LimitReader(body, hdr.Size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("failed to write entry %q: %w", hdr.Name, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("failed to write entry %q: archive truncated after %d of %d bytes", hdr.Name, n, hdr.Size)
	}
	return nil
}

// addSymlink checks a symlink lexically and queues it; it is created once
// every file and directory exists, so no entry is written through a link.
func (x *extraction) addSymlink(name string, hdr *tar.Header) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return fmt.Errorf("%w: symlink %q has an empty target", ErrUnsafeEntry, hdr.Name)
	case strings.HasPrefix(target, "/"):
		return fmt.Errorf("%w: symlink %q points to the absolute path %q", ErrUnsafeEntry, hdr.Name, target)
	case strings.ContainsAny(target, "\x00\\"):
		return fmt.Errorf("%w: symlink %q has a target with NUL or backslash", ErrUnsafeEntry, hdr.Name)
	}
	resolved := path.Join(path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("%w: symlink %q points to %q, outside the archive root", ErrUnsafeEntry, hdr.Name, target)
	}
	x.symlinks = append(x.symlinks, pendingSymlink{name: name, target: target})
	return nil
}

// finishSymlinks creates the queued symlinks, then resolves each inside the
// root: a link that leads out of it (through other links) or to nothing is
// refused.
func (x *extraction) finishSymlinks() error {
	for _, l := range x.symlinks {
		if dir := path.Dir(l.name); dir != "." {
			if err := x.mkdirAll(dir, l.name); err != nil {
				return err
			}
		}
		if err := x.root.Symlink(l.target, l.name); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%w: symlink %q: %s already exists", ErrUnsafeEntry, l.name, l.name)
			}
			return fmt.Errorf("failed to create symlink %q: %w", l.name, err)
		}
		x.noteCreated(l.name)
	}
	for _, l := range x.symlinks {
		if _, err := x.root.Stat(l.name); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%w: symlink %q points to %q, which is not in the archive", ErrUnsafeEntry, l.name, l.target)
			}
			return fmt.Errorf("%w: symlink %q points to %q, which resolves outside the archive root: %v", ErrUnsafeEntry, l.name, l.target, err)
		}
	}
	return nil
}

func (x *extraction) removeCreated() {
	for i := len(x.created) - 1; i >= 0; i-- {
		_ = x.root.RemoveAll(x.created[i])
	}
}

// limitedReader fails, rather than truncating, once more than limit bytes
// have been read.
type limitedReader struct {
	r     io.Reader
	limit int64
	n     int64
	what  string
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n > l.limit {
		return 0, fmt.Errorf("%w: %s is larger than %d bytes", ErrLimitExceeded, l.what, l.limit)
	}
	if rest := l.limit + 1 - l.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > l.limit {
		return n, fmt.Errorf("%w: %s is larger than %d bytes", ErrLimitExceeded, l.what, l.limit)
	}
	return n, err
}
