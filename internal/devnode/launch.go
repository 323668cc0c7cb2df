package devnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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

func isCrossDevice(err error) bool { return errors.Is(err, syscall.EXDEV) }

// prepare pulls the container's image (or picks the host binary, when
// opted in), resolves its environment, lays out its root and maps its
// arguments. A *configError means "retry later", a *pullError "back off
// and pull again", an *unsupportedError "never".
func (w *podWorker) prepare(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (*processSpec, error) {
	var (
		img      *pulledImage
		argv     []string
		podStart int
		err      error
	)
	if w.node.runsHostBinary(c) {
		argv, err = binaryArgs(c, w.node.opts.Images)
		argv = append([]string{w.node.opts.Binary}, argv...)
	} else if img, err = w.node.images.pull(ctx, c); err == nil {
		argv, podStart, err = imageArgv(c, img)
	}
	if err != nil {
		return nil, err
	}
	paths := w.containerPaths(c.Name)
	base, path, home, imgMapper, err := w.layOutRoot(paths, c, img)
	if err != nil {
		return nil, err
	}
	if base, err = w.nodeEnv(pod, c, paths, base, path, home); err != nil {
		return nil, err
	}
	vars, err := resolveEnv(ctx, newObjectSource(w.node.client, pod.Namespace), pod, c, w.podIP(), base)
	if err != nil {
		return nil, err
	}
	list := newEnvList(vars)
	if err := containerRoot(paths.root, c.VolumeMounts, w.volumesDir(), list.lookup); err != nil {
		return nil, err
	}
	mapper := newPathMapper(paths.root, c.VolumeMounts)
	spec := &processSpec{root: paths.root, mapper: mapper, dir: paths.root}
	// devnode's own variables hold host paths already (KUBECONFIG, HOME,
	// TMPDIR, PATH, the image's): only the pod's values are in the
	// container's terms. Rewriting a host path would break it when it
	// happens to start with a mount path, such as /tmp.
	hostValues := make(map[string]string, len(base))
	for _, v := range base {
		hostValues[v.name] = v.value
	}
	for _, v := range vars {
		value := v.value
		if hv, ok := hostValues[v.name]; !ok || hv != value {
			value = mapper.rewrite(value)
		}
		spec.env = append(spec.env, v.name+"="+value)
	}
	argv0 := argv[0]
	if podStart == 0 {
		argv0 = expand(argv0, list.lookup)
	}
	for i, a := range argv[1:] {
		if i+1 < podStart {
			spec.args = append(spec.args, imgMapper.rewrite(a))
		} else {
			spec.args = append(spec.args, mapper.rewrite(expand(a, list.lookup)))
		}
	}
	workingDir := c.WorkingDir
	if img != nil {
		spec.imageID = img.id
		if workingDir == "" {
			workingDir = img.config.WorkingDir
		}
	}
	spec.lookup = w.programLookup(img, paths.root, path)
	if spec.exe, err = spec.lookup(argv0); err != nil {
		return nil, fmt.Errorf("container %q: %w", c.Name, err)
	}
	if workingDir != "" {
		spec.dir = filepath.Join(paths.root, filepath.Clean("/"+workingDir))
		if err := os.MkdirAll(spec.dir, 0o755); err != nil {
			return nil, fmt.Errorf("failed to create working directory %s: %w", workingDir, err)
		}
	}
	return spec, nil
}

// nodeEnv appends what devnode gives every process to env (the image's):
// PATH and HOME (host paths already), the pod's identity, the API server,
// KUBECONFIG when the service account is mounted, and the node's own Env.
func (w *podWorker) nodeEnv(pod *corev1.Pod, c *corev1.Container, paths containerPaths, env []envVar, path, home string) ([]envVar, error) {
	env = append(env,
		envVar{"PATH", path},
		envVar{"HOME", home}, // the image's, moved into root, else root/root
		envVar{"TMPDIR", filepath.Join(paths.root, "tmp")},
		envVar{"HOSTNAME", pod.Name},
		envVar{EnvPodIP, w.podIP()},
		envVar{EnvPodName, pod.Name},
		envVar{EnvPodNamespace, pod.Namespace},
		envVar{EnvPodRoot, paths.root},
		envVar{"KUBERNETES_SERVICE_HOST", w.node.apiHost},
		envVar{"KUBERNETES_SERVICE_PORT", w.node.apiPort},
		envVar{"KUBERNETES_SERVICE_PORT_HTTPS", w.node.apiPort},
	)
	if mountsServiceAccount(c) {
		kubeconfig, err := writePodKubeconfig(paths, w.node.apiURL)
		if err != nil {
			return nil, err
		}
		env = append(env, envVar{"KUBECONFIG", kubeconfig})
	}
	for _, e := range w.node.opts.Env {
		env = append(env, envVar{e.Name, e.Value})
	}
	return env, nil
}

// programLookup finds a container's programs (its entrypoint, an exec
// probe's command): in the image under root, on its PATH, or, in
// host-binary mode, only the terrace binary.
func (w *podWorker) programLookup(img *pulledImage, root, path string) func(argv0 string) (string, error) {
	if img != nil {
		return func(argv0 string) (string, error) { return lookPath(root, argv0, path) }
	}
	return func(argv0 string) (string, error) {
		if !isTerraceCommand(argv0) {
			return "", fmt.Errorf("%s is not the terrace binary", argv0)
		}
		return w.node.opts.Binary, nil
	}
}

func mountsServiceAccount(c *corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) == serviceAccountMountPath {
			return true
		}
	}
	return false
}

// writePodKubeconfig points client-go at the API server with the pod's own
// service-account token: in-cluster configuration reads fixed paths that do
// not exist on the host, but clients honour KUBECONFIG.
func writePodKubeconfig(paths containerPaths, apiURL string) (string, error) {
	sa := filepath.Join(paths.root, serviceAccountMountPath)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["devnode"] = &clientcmdapi.Cluster{Server: apiURL, CertificateAuthority: filepath.Join(sa, "ca.crt")}
	cfg.AuthInfos["pod"] = &clientcmdapi.AuthInfo{TokenFile: filepath.Join(sa, "token")}
	cfg.Contexts["devnode"] = &clientcmdapi.Context{Cluster: "devnode", AuthInfo: "pod"}
	cfg.CurrentContext = "devnode"
	path := filepath.Join(paths.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("failed to write pod kubeconfig: %w", err)
	}
	return path, nil
}

// layOutRoot makes the container's root: the usual directories, and for an
// image its files, its environment, PATH and HOME, and the mapper of its
// paths into root. HOME is root/root unless the image sets one.
func (w *podWorker) layOutRoot(paths containerPaths, c *corev1.Container, img *pulledImage) (env []envVar, path, home string, m pathMapper, err error) {
	home = filepath.Join(paths.root, "root")
	for _, d := range []string{paths.root, filepath.Join(paths.root, "tmp"), home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, "", "", m, fmt.Errorf("failed to create %s: %w", d, err)
		}
	}
	if img == nil {
		return nil, w.node.path, home, pathMapper{root: paths.root}, nil
	}
	if err := mirrorRootfs(img.rootfs, paths.root, c.VolumeMounts); err != nil {
		return nil, "", "", m, fmt.Errorf("failed to lay out the image's files: %w", err)
	}
	if m, err = imageMapper(paths.root, img.rootfs); err != nil {
		return nil, "", "", m, err
	}
	env, path, imgHome := imageEnv(img, m)
	if imgHome != "" {
		home = imgHome
	}
	return env, path, home, m, nil
}
