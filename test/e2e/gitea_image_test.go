package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/terrace-dev/terrace/internal/image"
)

// Where the Gitea image keeps things. Gitea runs as giteaUID with its
// work path under giteaDataDir, an emptyDir.
const (
	giteaBinaryPath = "/usr/local/bin/gitea"
	giteaStaticDir  = "/usr/share/gitea" // STATIC_ROOT_PATH: templates/, options/, public/
	giteaDataDir    = "/data"
	giteaUID        = 65532
	// gitExecPath is Debian's git exec path, where git finds its helpers
	// (git-upload-pack and the rest are links to git there).
	gitExecPath = "/usr/lib/git-core"
	// gitTemplates is where git init copies a new repository's skeleton
	// from, compiled into Debian's git.
	gitTemplates = "/usr/share/git-core/templates"
)

// buildGiteaImage assembles the image Gitea runs from on the dev node, with
// internal/image's deterministic layers and no Docker:
//   - the users and writable directories;
//   - Debian's static busybox (hack/install-deps.sh's busybox-static),
//     linked from /bin and /usr/bin/env: Gitea's git hooks are scripts
//     (`#!/usr/bin/env sh`, SCRIPT_TYPE=sh), and init steps run in sh;
//   - Debian's git as installed on this host (its exec path, templates,
//     and the shared libraries ldd lists for every ELF file of them, with
//     the dynamic loader): Gitea shells out to git for every repository
//     operation, and git over HTTP is git-upload-pack/git-receive-pack;
//   - Gitea's static files (built without the bindata tag, it reads its
//     templates, options and public files from STATIC_ROOT_PATH);
//   - the gitea binary.
//
// giteaBin is $TERRACE_GITEA_BIN (hack/tools/build.sh).
func buildGiteaImage(giteaBin string) (v1.Image, error) {
	created := time.Unix(0, 0).UTC()
	layer := func(files []image.File) (v1.Layer, error) {
		return image.FilesLayer(files, created, image.Uncompressed)
	}
	base := []image.File{
		{Path: "/etc/passwd", Data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\ngitea:x:%d:%d:gitea:%s:/bin/sh\n", giteaUID, giteaUID, giteaDataDir)},
		{Path: "/etc/group", Data: fmt.Appendf(nil, "root:x:0:\ngitea:x:%d:\n", giteaUID)},
		{Path: "/etc/nsswitch.conf", Data: []byte("hosts: files dns\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: giteaDataDir, Dir: true, Mode: 0o755, UID: giteaUID, GID: giteaUID},
	}
	shell, err := busyboxFiles(busybox)
	if err != nil {
		return nil, err
	}
	git, err := gitFiles()
	if err != nil {
		return nil, err
	}
	static, err := filepath.EvalSymlinks(filepath.Join(giteaBin, "static"))
	if err != nil {
		return nil, fmt.Errorf("gitea's static files: %w (run `make tools`)", err)
	}
	var assets []image.File
	for _, dir := range []string{"templates", "options", "public"} {
		files, err := hostTree(filepath.Join(static, dir), giteaStaticDir+"/"+dir)
		if err != nil {
			return nil, err
		}
		assets = append(assets, files...)
	}
	binary := []image.File{{Path: giteaBinaryPath, HostPath: filepath.Join(giteaBin, "gitea"), Mode: 0o755}}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, part := range []struct {
		what  string
		files []image.File
	}{{"base", base}, {"busybox", shell}, {"git", git}, {"gitea static files", assets}, {"gitea", binary}} {
		l, err := layer(part.files)
		if err != nil {
			return nil, fmt.Errorf("failed to build the %s layer: %w", part.what, err)
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "terrace e2e: " + part.what}}); err != nil {
			return nil, err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		Entrypoint: []string{giteaBinaryPath},
		User:       fmt.Sprintf("%d:%d", giteaUID, giteaUID),
		WorkingDir: giteaDataDir,
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=" + giteaDataDir,
			"GITEA_WORK_DIR=" + giteaDataDir + "/gitea",
		},
	}
	return mutate.ConfigFile(img, cfg)
}

// busyboxFiles are /bin/busybox and a link to it in /bin for each command
// it lists, and /usr/bin/env, where scripts' #! lines find it.
func busyboxFiles(busybox string) ([]image.File, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("failed to list the commands of %s (hack/install-deps.sh test installs busybox-static): %w", busybox, err)
	}
	files := []image.File{
		{Path: "/bin/busybox", HostPath: busybox, Mode: 0o755},
		{Path: "/usr/bin/env", LinkTo: "../../bin/busybox"},
	}
	for _, cmd := range strings.Fields(string(out)) {
		if cmd != "busybox" && !strings.Contains(cmd, "/") {
			files = append(files, image.File{Path: "/bin/" + cmd, LinkTo: "busybox"})
		}
	}
	return files, nil
}

// gitFiles are this host's git (Debian's package, which hack/install-deps.sh
// installs): the exec path with its links as they are, /usr/bin/git linked
// into it, the templates, and every shared library its ELF files need, at
// the paths ldd resolves them to.
func gitFiles() ([]image.File, error) {
	if _, err := os.Stat(filepath.Join(gitExecPath, "git")); err != nil {
		return nil, fmt.Errorf("no git in %s: install Debian's git (hack/install-deps.sh test): %w", gitExecPath, err)
	}
	files, err := hostTree(gitExecPath, gitExecPath)
	if err != nil {
		return nil, err
	}
	templates, err := hostTree(gitTemplates, gitTemplates)
	if err != nil {
		return nil, err
	}
	files = append(files, templates...)
	files = append(files, image.File{Path: "/usr/bin/git", LinkTo: "../lib/git-core/git"})
	libs := map[string]bool{}
	for _, f := range files {
		if f.HostPath == "" || !isELF(f.HostPath) {
			continue
		}
		needed, err := sharedLibraries(f.HostPath)
		if err != nil {
			return nil, err
		}
		for _, lib := range needed {
			libs[lib] = true
		}
	}
	if len(libs) == 0 {
		return nil, errors.New("ldd lists no shared library for git: is it linked statically? the image expects Debian's git")
	}
	sorted := make([]string, 0, len(libs))
	for lib := range libs {
		sorted = append(sorted, lib)
	}
	sort.Strings(sorted)
	for _, lib := range sorted {
		files = append(files, image.File{Path: lib, HostPath: lib, Mode: 0o755})
	}
	return files, nil
}

// lddLine is one library of ldd's output: "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)"
// or the loader, "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// sharedLibraries lists the libraries ldd resolves for an ELF file.
func sharedLibraries(path string) ([]string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("ldd", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(string(out)+stderr.String(), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", path, err, stderr.String())
	}
	if strings.Contains(string(out), "not found") {
		return nil, fmt.Errorf("ldd %s finds not every library:\n%s", path, out)
	}
	var libs []string
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs, nil
}

func isELF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	magic := make([]byte, 4)
	n, _ := f.Read(magic)
	return n == 4 && string(magic) == "\x7fELF"
}

// hostTree lists the directories, files and symbolic links under the host
// directory root as entries under dir in the image: files keep whether
// they are executable, links their targets.
func hostTree(root, dir string) ([]image.File, error) {
	var files []image.File
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		target := filepath.ToSlash(filepath.Join(dir, rel))
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			files = append(files, image.File{Path: target, LinkTo: link})
		case d.IsDir():
			files = append(files, image.File{Path: target, Dir: true})
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			mode := int64(0o644)
			if info.Mode().Perm()&0o111 != 0 {
				mode = 0o755
			}
			files = append(files, image.File{Path: target, HostPath: p, Mode: mode})
		default:
			return fmt.Errorf("%s is neither a file, a directory nor a link", p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", root, err)
	}
	return files, nil
}

// pushGiteaImage builds the Gitea image and pushes it to the dev cluster's
// registry (registryHost, where this machine pushes) as ref.
func pushGiteaImage(ctx context.Context, registryHost, ref, giteaBin string) error {
	img, err := buildGiteaImage(giteaBin)
	if err != nil {
		return fmt.Errorf("failed to build the Gitea image: %w", err)
	}
	_, path, _ := strings.Cut(ref, "/") // the registry's name goes: every name resolves to the dev registry
	if _, err := image.PushImage(ctx, img, registryHost+"/"+path); err != nil {
		return fmt.Errorf("failed to push the Gitea image: %w", err)
	}
	return nil
}
