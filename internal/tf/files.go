package tf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// FileLocation says where a mapped file is written.
type FileLocation int

const (
	// InModule is the module directory.
	InModule FileLocation = iota + 1
	// InHome is a home directory of the executor's own (under the work
	// dir), which tofu then gets as HOME.
	InHome
)

// maxMappedFileBytes bounds one mapped file (a Secret holds at most 1 MiB).
const maxMappedFileBytes = 1 << 20

// MappedFile is a file written before init, e.g. credentials from a Secret.
type MappedFile struct {
	Location FileLocation
	// Path is relative to the location and may not leave it.
	Path    string
	Content []byte
}

// HomeDir is the home directory mapped files of InHome go to.
func (e *Executor) HomeDir() string { return filepath.Join(e.cfg.WorkDir, "home") }

// writeMappedFiles writes files (mode 0600) below the module dir or the
// home dir. A path that is absolute, climbs out with "..", or reaches
// outside through a symlink of the source is refused. Contents are taught
// to the redactor: they usually are credentials.
func (e *Executor) writeMappedFiles(moduleDir string, files []MappedFile) error {
	for _, f := range files {
		root := moduleDir
		switch f.Location {
		case InModule:
		case InHome:
			root = e.HomeDir()
			if err := os.MkdirAll(root, 0o700); err != nil {
				return fmt.Errorf("failed to create the home directory: %w", err)
			}
			e.home = root
		default:
			return fmt.Errorf("%w: file %q has no location", ErrInvalidArgument, f.Path)
		}
		if len(f.Content) > maxMappedFileBytes {
			return fmt.Errorf("%w: file %q is over %d bytes", ErrInvalidArgument, f.Path, maxMappedFileBytes)
		}
		if err := writeInside(root, f.Path, f.Content); err != nil {
			return err
		}
		if len(strings.TrimSpace(string(f.Content))) > 0 {
			e.redactor.Add(strings.TrimSpace(string(f.Content)))
		}
	}
	return nil
}

// writeInside writes content to rel below root, refusing any escape: each
// directory on the way is created or must be a real directory (never a
// symlink), and the file itself is opened without following a symlink.
func writeInside(root, rel string, content []byte) error {
	clean := filepath.Clean(filepath.FromSlash(rel))
	if rel == "" || filepath.IsAbs(clean) || clean == "." || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return fmt.Errorf("%w: file path %q must be relative and stay inside its location", ErrInvalidArgument, rel)
	}
	dir, err := filepath.EvalSymlinks(root)
	if err != nil {
		return fmt.Errorf("failed to resolve %s: %w", root, err)
	}
	parts := strings.Split(clean, string(filepath.Separator))
	for _, part := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, part)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(dir, 0o700); err != nil {
				return fmt.Errorf("failed to create the directory of %q: %w", rel, err)
			}
		case err != nil:
			return fmt.Errorf("failed to read the directory of %q: %w", rel, err)
		case fi.Mode()&os.ModeSymlink != 0:
			return fmt.Errorf("%w: file path %q goes through a symlink", ErrInvalidArgument, rel)
		case !fi.IsDir():
			return fmt.Errorf("%w: file path %q goes through a file", ErrInvalidArgument, rel)
		}
	}
	out, err := os.OpenFile(filepath.Join(dir, parts[len(parts)-1]), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		if isSymlinkRefusal(err) {
			return fmt.Errorf("%w: file path %q is a symlink", ErrInvalidArgument, rel)
		}
		return fmt.Errorf("failed to write file %q: %w", rel, err)
	}
	if _, err := out.Write(content); err != nil {
		_ = out.Close()
		return fmt.Errorf("failed to write file %q: %w", rel, err)
	}
	return out.Close()
}
