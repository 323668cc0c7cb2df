package devnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// A container of a pulled image runs without chroot or namespaces, which
// would need privileges devnode does not have: its root directory (the
// container's "/" on the host, per pod and container) mirrors the image's
// unpacked rootfs — directories made, files hard-linked (symbolically
// linked across file systems), so a container costs no copy — and every
// path the image names (entrypoint, PATH, HOME, working dir, its own
// environment) is resolved inside that root. Volume mounts are linked over
// it as for any container; what the image has below a mount is hidden, as
// a mount hides it. Programs that open fixed absolute paths of their own
// still see the host's; Terrace's binaries take every path from flags or
// the environment.

// defaultPath is the PATH of an image that sets none (the kubelet's).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// imageArgv is the container's command line in the image's terms, by the
// Kubernetes rules: command replaces the entrypoint (and drops the image's
// cmd), args replace the cmd. podStart is where the pod's own words begin:
// those get $(VAR) expansion and mount paths, the image's words the
// image's paths.
func imageArgv(c *corev1.Container, img *pulledImage) (argv []string, podStart int, err error) {
	switch {
	case len(c.Command) > 0:
		argv = append(append(argv, c.Command...), c.Args...)
	case len(c.Args) > 0:
		argv = append(append(argv, img.config.Entrypoint...), c.Args...)
		podStart = len(img.config.Entrypoint)
	default:
		argv = append(append(argv, img.config.Entrypoint...), img.config.Cmd...)
		podStart = len(argv)
	}
	if len(argv) == 0 {
		return nil, 0, fmt.Errorf("container %q: image %s has no entrypoint and the pod names no command", c.Name, c.Image)
	}
	return argv, podStart, nil
}

// imageEnv is the image's environment, paths moved into root, without PATH
// and HOME, which devnode sets from it.
func imageEnv(img *pulledImage, m pathMapper) (env []envVar, path, home string) {
	path, home = defaultPath, ""
	for _, kv := range img.config.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH":
			path = v
		case "HOME":
			home = v
		default:
			env = append(env, envVar{k, m.rewrite(v)})
		}
	}
	return env, m.rewrite(path), m.rewrite(home)
}

// imageMapper maps the image's top-level entries (/usr, /etc, ...) into
// root, for the paths the image itself names.
func imageMapper(root, rootfs string) (pathMapper, error) {
	entries, err := os.ReadDir(rootfs)
	if err != nil {
		return pathMapper{}, fmt.Errorf("failed to read the image's root: %w", err)
	}
	var mounts []corev1.VolumeMount
	for _, e := range entries {
		mounts = append(mounts, corev1.VolumeMount{MountPath: "/" + e.Name()})
	}
	return newPathMapper(root, mounts), nil
}

// lookPath finds the program argv0 names inside root: a path as is, a
// bare name on the container's PATH (already moved into root).
func lookPath(root, argv0, path string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := filepath.Join(root, filepath.Clean("/"+argv0))
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%s: no such executable in the image", argv0)
	}
	for _, dir := range filepath.SplitList(path) {
		if !strings.HasPrefix(dir, root+string(filepath.Separator)) {
			continue // only the image's own directories
		}
		if p := filepath.Join(dir, argv0); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: executable file not found in the image's $PATH", argv0)
}

func isExecutable(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

// mirrorRootfs lays rootfs out in root (see above). It skips what exists,
// so a restarted container keeps what it wrote, and what lies at or below
// a mount path.
func mirrorRootfs(rootfs, root string, mounts []corev1.VolumeMount) error {
	hidden := make([]string, 0, len(mounts))
	for _, m := range mounts {
		hidden = append(hidden, filepath.Clean("/"+m.MountPath))
	}
	return filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rootfs, p)
		if err != nil || rel == "." {
			return err
		}
		abs := "/" + filepath.ToSlash(rel)
		for _, h := range hidden {
			if abs == h || strings.HasPrefix(abs, h+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		dst := filepath.Join(root, rel)
		if _, err := os.Lstat(dst); err == nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(dst, 0o700); err != nil {
				return err
			}
			return os.Chmod(dst, info.Mode()&(fs.ModePerm|fs.ModeSticky)|0o700)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				target = filepath.Join(root, target) // the image's path, not the host's
			}
			return os.Symlink(target, dst)
		case info.Mode().IsRegular():
			if err := os.Link(p, dst); err != nil {
				if !errors.Is(err, os.ErrPermission) && !isCrossDevice(err) {
					return err
				}
				return os.Symlink(p, dst)
			}
			return nil
		default:
			return nil
		}
	})
}

func isCrossDevice(err error) bool {
	var linkErr *os.LinkError
	return errors.As(err, &linkErr) && strings.Contains(linkErr.Err.Error(), "cross-device")
}
