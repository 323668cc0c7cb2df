// Package image builds Terrace's container image without a container
// engine: a static terrace binary and its lean terrace-runner, a static
// tofu binary, a CA bundle, a non-root user and writable /tmp and work
// directories, assembled with go-containerregistry into an OCI index of
// one image per platform. The same inputs always give the same digest:
// entries are sorted, and every timestamp, owner and mode is fixed by the
// builder.
package image

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/terrace-dev/terrace/internal/runnerbin"
)

// Where things are in the image.
const (
	// UID and GID of the user the image runs as (distroless's "nonroot").
	UID = 65532
	// BinDir holds terrace and tofu.
	BinDir = "/usr/local/bin"
	// Entrypoint is the terrace binary.
	Entrypoint = BinDir + "/terrace"
	// RunnerPath is the terrace-runner binary, the command of runner pods.
	RunnerPath = runnerbin.ImagePath
	// Home is the user's home directory.
	Home = "/home/nonroot"
	// WorkDir is the image's working directory, writable by the user.
	WorkDir = "/workspace"
	// CABundle is where Go (and most tools) look for trusted roots on Linux.
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	// ProviderMirrorDir holds the providers of Platform.ProviderMirror, a
	// filesystem mirror for runners (--runner-provider-mirror).
	ProviderMirrorDir = "/usr/share/terrace/providers"
)

// OCI annotation keys the image's config labels carry.
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelRevision = "org.opencontainers.image.revision"
	LabelVersion  = "org.opencontainers.image.version"
	LabelTitle    = "org.opencontainers.image.title"
)

// Platform is one image of the index and the binaries it is made of.
type Platform struct {
	// OS and Architecture, such as linux and arm64.
	OS, Architecture string
	// Terrace and Tofu are paths on the host of static binaries built for
	// this platform.
	Terrace, Tofu string
	// Runner is the host path of the static terrace-runner binary (runner
	// pods start it). Empty, the image links terrace-runner to terrace,
	// which then behaves as it: what `terrace dev` does with a terrace
	// binary that has no terrace-runner beside it.
	Runner string
	// ProviderMirror is a host directory laid out as tofu's filesystem
	// mirror (<host>/<namespace>/<type>/...), copied to ProviderMirrorDir
	// in a layer of its own: how an air-gapped cluster (or the dev
	// cluster's tests) gives runners providers without a registry.
	// Optional.
	ProviderMirror string
	// Shell is the host path of a static busybox, installed as /bin/busybox
	// with /bin/sh and its other commands linked to it, in a layer of its
	// own: Terrace's image has no shell, and local-exec provisioners run
	// /bin/sh, so an image for such modules adds one (the end-to-end
	// tests' does). Optional.
	Shell string
}

// String is the platform in os/arch form.
func (p Platform) String() string { return p.OS + "/" + p.Architecture }

// Options describe an image build.
type Options struct {
	// Platforms are the images of the index, at least one.
	Platforms []Platform
	// Source, Revision and Version become the OCI labels.
	Source, Revision, Version string
	// Created is every timestamp in the image: the config's, the history's
	// and every file's. The Unix epoch when zero. `make image` passes the
	// commit's time, so one commit gives one digest.
	Created time.Time
	// CABundle is the PEM bundle installed at /etc/ssl/certs; the Mozilla
	// roots of golang.org/x/crypto/x509roots/fallback (pinned by go.sum,
	// so the same on every machine) when empty.
	CABundle []byte
	// CompressionLevel is the gzip level, or Uncompressed; DefaultCompression
	// when zero.
	CompressionLevel int
}

// Build assembles the index of one image per platform.
func Build(opts Options) (v1.ImageIndex, error) {
	if len(opts.Platforms) == 0 {
		return nil, errors.New("no platform to build: name at least one, such as linux/amd64")
	}
	base, err := baseLayer(opts)
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, p := range opts.Platforms {
		if seen[p.String()] {
			return nil, fmt.Errorf("platform %s named twice", p)
		}
		seen[p.String()] = true
		img, err := buildImage(opts, p, base)
		if err != nil {
			return nil, fmt.Errorf("failed to build the %s image: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture}},
		})
	}
	return idx, nil
}

// BuildImage assembles the image of a single platform (the dev cluster
// pushes only the host's).
func BuildImage(opts Options, p Platform) (v1.Image, error) {
	base, err := baseLayer(opts)
	if err != nil {
		return nil, err
	}
	return buildImage(opts, p, base)
}

func buildImage(opts Options, p Platform, base v1.Layer) (v1.Image, error) {
	bins := []string{p.Terrace, p.Tofu}
	if p.Runner != "" {
		bins = append(bins, p.Runner) // else linked to terrace
	}
	for _, bin := range bins {
		if info, err := os.Stat(bin); err != nil || !info.Mode().IsRegular() {
			return nil, fmt.Errorf("binary %q is missing: build it for %s first (make image does)", bin, p)
		}
	}
	created := opts.created()
	// tofu changes with its version only, terrace with every commit: two
	// layers, so an upgrade of terrace alone moves one layer.
	tofu, err := layerFiles{{name: strings.TrimPrefix(BinDir, "/") + "/tofu", mode: 0o755, hostPath: p.Tofu}}.withParents().layer(created, opts.level())
	if err != nil {
		return nil, err
	}
	runner := entry{name: strings.TrimPrefix(RunnerPath, "/"), mode: 0o755, hostPath: p.Runner}
	if p.Runner == "" {
		runner.mode, runner.hostPath, runner.linkTo = 0o777, "", path.Base(Entrypoint)
	}
	terrace, err := layerFiles{{name: strings.TrimPrefix(Entrypoint, "/"), mode: 0o755, hostPath: p.Terrace}, runner}.withParents().layer(created, opts.level())
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	layers := []mutate.Addendum{
		{Layer: base, History: history(created, "users, CA bundle, /tmp, "+WorkDir)},
		{Layer: tofu, History: history(created, "tofu")},
	}
	if p.ProviderMirror != "" {
		files, err := treeFiles(p.ProviderMirror, strings.TrimPrefix(ProviderMirrorDir, "/"))
		if err != nil {
			return nil, err
		}
		mirror, err := files.withParents().layer(created, opts.level())
		if err != nil {
			return nil, err
		}
		layers = append(layers, mutate.Addendum{Layer: mirror, History: history(created, "provider mirror")})
	}
	if p.Shell != "" {
		shell, err := shellFiles(p.Shell)
		if err != nil {
			return nil, err
		}
		layer, err := shell.withParents().layer(created, opts.level())
		if err != nil {
			return nil, err
		}
		layers = append(layers, mutate.Addendum{Layer: layer, History: history(created, "busybox shell")})
	}
	layers = append(layers, mutate.Addendum{Layer: terrace, History: history(created, "terrace "+opts.Version)})
	img, err = mutate.Append(img, layers...)
	if err != nil {
		return nil, fmt.Errorf("failed to add layers: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = p.OS, p.Architecture
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       fmt.Sprintf("%d:%d", UID, UID),
		WorkingDir: WorkDir,
		Env: []string{
			"PATH=" + BinDir + ":/usr/bin:/bin",
			"HOME=" + Home,
			"SSL_CERT_FILE=" + CABundle,
		},
		Labels: opts.labels(),
	}
	return mutate.ConfigFile(img, cfg)
}

func history(created time.Time, what string) v1.History {
	return v1.History{Created: v1.Time{Time: created}, CreatedBy: "terrace make image: " + what}
}

// baseLayer is the part every platform shares: users, the CA bundle and the
// writable directories.
func baseLayer(opts Options) (v1.Layer, error) {
	ca := opts.CABundle
	if len(ca) == 0 {
		ca = MozillaRoots()
	}
	files := layerFiles{
		{name: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", UID, UID, Home))},
		{name: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID))},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: strings.TrimPrefix(CABundle, "/"), mode: 0o644, data: ca},
		{name: "tmp", dir: true, mode: 0o1777},
		{name: "root", dir: true, mode: 0o700},
		{name: strings.TrimPrefix(Home, "/"), dir: true, mode: 0o700, uid: UID, gid: UID},
		{name: strings.TrimPrefix(WorkDir, "/"), dir: true, mode: 0o755, uid: UID, gid: UID},
	}
	return files.withParents().layer(opts.created(), opts.level())
}

func (o Options) created() time.Time {
	if o.Created.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return o.Created.UTC()
}

func (o Options) level() int {
	if o.CompressionLevel == 0 {
		return DefaultCompression
	}
	return o.CompressionLevel
}

func (o Options) labels() map[string]string {
	labels := map[string]string{LabelTitle: "terrace"}
	for k, v := range map[string]string{LabelSource: o.Source, LabelRevision: o.Revision, LabelVersion: o.Version} {
		if v != "" {
			labels[k] = v
		}
	}
	return labels
}
