package devcluster

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/terrace-dev/terrace/internal/image"
)

// pushBinaryImage builds an image of one static binary at /<name>, run as
// user 65532 with args after it, and pushes it to the registry under the
// path and tag of ref (the registry part of ref is dropped: the node
// resolves every registry to this one). The layer is streamed from the
// file, never held in memory.
func (r *Registry) pushBinaryImage(ctx context.Context, ref, binary string, args ...string) error {
	info, err := os.Stat(binary)
	if err != nil {
		return fmt.Errorf("failed to read the binary for %s: %w", ref, err)
	}
	name := filepath.Base(binary)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeBinaryTar(pw, binary, name, info.Size())) }()
		return pr, nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return fmt.Errorf("failed to build the layer of %s: %w", ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = runtime.GOARCH, "linux"
	cfg.Config = v1.Config{Entrypoint: append([]string{"/" + name}, args...), User: "65532:65532"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	if _, err := image.PushImage(ctx, img, r.Host+"/"+repositoryPath(ref)); err != nil {
		return err
	}
	return nil
}

func writeBinaryTar(w io.Writer, path, name string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return err
	}
	return tw.Close()
}

// repositoryPath drops the registry from an image reference:
// registry.k8s.io/pause:3.10 is pause:3.10 in the dev registry.
func repositoryPath(ref string) string {
	first, rest, ok := strings.Cut(ref, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return rest
	}
	return ref
}

// pushNodeImages pushes the images the node itself runs: the pause
// process every pod sandbox holds, and CoreDNS.
func (r *Registry) pushNodeImages(ctx context.Context, nodeBinDir string) error {
	if err := r.pushBinaryImage(ctx, PauseImage, filepath.Join(nodeBinDir, "pause")); err != nil {
		return err
	}
	return r.pushBinaryImage(ctx, CoreDNSImage, filepath.Join(nodeBinDir, "coredns"))
}
