package devnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
)

// Waiting reasons of a container whose image cannot be pulled, as the
// kubelet reports them.
const (
	ReasonErrImagePull      = "ErrImagePull"
	ReasonImagePullBackOff  = "ImagePullBackOff"
	ReasonInvalidImageName  = "InvalidImageName"
	ReasonErrImageNeverPull = "ErrImageNeverPull"
)

// pullTimeout bounds one pull (resolve, download, unpack).
const pullTimeout = 5 * time.Minute

// pulledImage is an image unpacked on this node.
type pulledImage struct {
	// id is repository@digest of the platform's manifest, the ImageID.
	id string
	// rootfs is the unpacked filesystem, shared by every container of the
	// image: never written to.
	rootfs string
	config v1.Config
}

// imageStore pulls images for the node's platform and keeps each one
// unpacked under dir/<digest>/, so that a digest is pulled and unpacked once
// however many pods use it (and across devnode restarts).
type imageStore struct {
	dir      string
	rewrites map[string]string
	platform v1.Platform

	mu sync.Mutex
	// tags remembers which digest a tag had when last pulled, for
	// IfNotPresent; unpacking serialises on the digest's lock.
	tags    map[string]string
	unpacks map[string]*sync.Mutex
}

func newImageStore(dir string, rewrites map[string]string) *imageStore {
	return &imageStore{
		dir:      dir,
		rewrites: rewrites,
		platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		tags:     map[string]string{},
		unpacks:  map[string]*sync.Mutex{},
	}
}

// pullError is a failed pull: reason is ErrImagePull, InvalidImageName or
// ErrImageNeverPull.
type pullError struct {
	reason, message string
}

func (e *pullError) Error() string { return e.message }

// pull returns the unpacked image for c, honouring its pull policy like the
// kubelet: Always asks the registry for the tag's digest, IfNotPresent uses
// what this node already has, Never only that.
func (s *imageStore) pull(ctx context.Context, c *corev1.Container) (*pulledImage, error) {
	ref, err := name.ParseReference(c.Image)
	if err != nil {
		return nil, &pullError{reason: ReasonInvalidImageName, message: fmt.Sprintf("Failed to apply default image tag %q: couldn't parse image name %q: %v", c.Image, c.Image, err)}
	}
	source := s.rewrite(ref)
	policy := c.ImagePullPolicy
	if policy == "" {
		policy = corev1.PullIfNotPresent
		if tag, ok := ref.(name.Tag); ok && tag.TagStr() == "latest" {
			policy = corev1.PullAlways
		}
	}
	if policy != corev1.PullAlways {
		if img, ok := s.present(ref); ok {
			return img, nil
		}
		if policy == corev1.PullNever {
			return nil, &pullError{reason: ReasonErrImageNeverPull, message: fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	remoteImg, err := remote.Image(source, remote.WithContext(ctx), remote.WithPlatform(s.platform), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		msg := fmt.Sprintf("Failed to pull image %q: %v", c.Image, err)
		if source.String() != ref.String() {
			msg = fmt.Sprintf("Failed to pull image %q from %s: %v", c.Image, source.Context().RegistryStr(), err)
		}
		return nil, &pullError{reason: ReasonErrImagePull, message: msg}
	}
	digest, err := remoteImg.Digest()
	if err != nil {
		return nil, &pullError{reason: ReasonErrImagePull, message: fmt.Sprintf("Failed to pull image %q: %v", c.Image, err)}
	}
	img, err := s.unpack(ref.Context().Name()+"@"+digest.String(), digest, remoteImg)
	if err != nil {
		return nil, &pullError{reason: ReasonErrImagePull, message: fmt.Sprintf("Failed to pull image %q: %v", c.Image, err)}
	}
	s.mu.Lock()
	s.tags[ref.String()] = digest.String()
	s.mu.Unlock()
	return img, nil
}

// rewrite maps the registries the node was told to take from elsewhere
// (the dev cluster's loopback registry stands in for ghcr.io).
func (s *imageStore) rewrite(ref name.Reference) name.Reference {
	to, ok := s.rewrites[ref.Context().RegistryStr()]
	if !ok {
		return ref
	}
	out, err := name.ParseReference(to + "/" + ref.Context().RepositoryStr() + sep(ref) + ref.Identifier())
	if err != nil {
		return ref
	}
	return out
}

func sep(ref name.Reference) string {
	if _, ok := ref.(name.Digest); ok {
		return "@"
	}
	return ":"
}

// present finds ref among the unpacked images: by digest, or by the digest
// its tag had when this node last pulled it.
func (s *imageStore) present(ref name.Reference) (*pulledImage, bool) {
	digest := ref.Identifier()
	if _, ok := ref.(name.Tag); ok {
		s.mu.Lock()
		digest = s.tags[ref.String()]
		s.mu.Unlock()
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return nil, false
	}
	img, err := s.load(ref.Context().Name()+"@"+h.String(), h)
	return img, err == nil
}

func (s *imageStore) imageDir(h v1.Hash) string { return filepath.Join(s.dir, h.Algorithm+"-"+h.Hex) }

// load reads an unpacked image's config; an error when it is not there.
func (s *imageStore) load(id string, h v1.Hash) (*pulledImage, error) {
	dir := s.imageDir(h)
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var cfg v1.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("corrupt image cache %s: %w", dir, err)
	}
	now := time.Now()
	_ = os.Chtimes(dir, now, now) // in use: kept by prune

	return &pulledImage{id: id, rootfs: filepath.Join(dir, "rootfs"), config: cfg}, nil
}

// unpack makes dir/<digest>/{rootfs,config.json} once: into a temporary
// directory, renamed into place when complete, so an interrupted unpack
// never passes for an image.
func (s *imageStore) unpack(id string, h v1.Hash, img v1.Image) (*pulledImage, error) {
	s.mu.Lock()
	lock := s.unpacks[h.String()]
	if lock == nil {
		lock = &sync.Mutex{}
		s.unpacks[h.String()] = lock
	}
	s.mu.Unlock()
	lock.Lock()
	defer lock.Unlock()
	if p, err := s.load(id, h); err == nil {
		return p, nil
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("failed to read the image config: %w", err)
	}
	if cfg.OS != "" && (cfg.OS != s.platform.OS || cfg.Architecture != s.platform.Architecture) {
		return nil, fmt.Errorf("the image is for %s/%s, this node is %s/%s", cfg.OS, cfg.Architecture, s.platform.OS, s.platform.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("failed to list layers: %w", err)
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(s.dir, ".unpack-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.Mkdir(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
		return nil, err
	}
	if err := unpackLayers(filepath.Join(tmp, "rootfs"), layers); err != nil {
		return nil, err
	}
	data, err := json.Marshal(cfg.Config)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), data, 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, s.imageDir(h)); err != nil && !errors.Is(err, os.ErrExist) && !strings.Contains(err.Error(), "directory not empty") {
		return nil, fmt.Errorf("failed to store the unpacked image: %w", err)
	}
	return s.load(id, h)
}

// unusedImageAge is how long an unpacked image stays in the cache after its
// last use: each build of the dev image is a new digest.
const unusedImageAge = 24 * time.Hour

// prune removes unpacked images (and abandoned unpacks) unused for
// unusedImageAge, as the kubelet's image garbage collection does.
func (s *imageStore) prune() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < unusedImageAge {
			continue
		}
		if strings.HasPrefix(e.Name(), "sha256-") || strings.HasPrefix(e.Name(), ".unpack-") {
			_ = os.RemoveAll(filepath.Join(s.dir, e.Name()))
		}
	}
}
