package image

import (
	"fmt"
	"path"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// File is one entry of a layer assembled from chosen files, for images
// other than Terrace's own (the end-to-end tests' Gitea image): a regular
// file streamed from HostPath or holding Data, a directory, or a symbolic
// link. Owner and time are fixed like every file of Terrace's image.
type File struct {
	// Path is where the entry is in the image ("/usr/bin/git").
	Path string
	// HostPath is the host file whose contents the entry has (symbolic
	// links followed); Data the contents when HostPath is empty.
	HostPath string
	Data     []byte
	// LinkTo makes the entry a symbolic link to this target.
	LinkTo string
	// Dir makes the entry a directory.
	Dir bool
	// Mode is the permission bits; 0755 for directories and 0644 for
	// files when zero (0777 for links, always).
	Mode int64
	// UID and GID own the entry (root when zero).
	UID, GID int
}

// FilesLayer builds a layer of files, with the directories leading to them
// that no File names (root's, 0755), in sorted order with every time set
// to created: the same files give the same digest. level is a gzip level
// or Uncompressed.
func FilesLayer(files []File, created time.Time, level int) (v1.Layer, error) {
	entries := make(layerFiles, 0, len(files))
	seen := map[string]bool{}
	for _, f := range files {
		name := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if name == "" {
			return nil, fmt.Errorf("file %q has no path in the image", f.Path)
		}
		if seen[name] {
			return nil, fmt.Errorf("/%s named twice", name)
		}
		seen[name] = true
		e := entry{name: name, dir: f.Dir, mode: f.Mode, uid: f.UID, gid: f.GID, data: f.Data, hostPath: f.HostPath, linkTo: f.LinkTo}
		switch {
		case f.LinkTo != "":
			e.mode = 0o777
		case e.mode == 0 && f.Dir:
			e.mode = 0o755
		case e.mode == 0:
			e.mode = 0o644
		}
		entries = append(entries, e)
	}
	return entries.withParents().layer(created.UTC(), level)
}
