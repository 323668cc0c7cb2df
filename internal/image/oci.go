package image

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// WriteLayout replaces dir with an OCI image layout holding idx, and
// returns idx's digest.
func WriteLayout(dir string, idx v1.ImageIndex) (v1.Hash, error) {
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("failed to compute the index digest: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, fmt.Errorf("failed to clear %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("failed to create the layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx); err != nil {
		return v1.Hash{}, fmt.Errorf("failed to write the image to %s: %w", dir, err)
	}
	return digest, nil
}

// ReadLayout returns the index WriteLayout wrote in dir.
func ReadLayout(dir string) (v1.ImageIndex, error) {
	outer, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("no image layout in %s (run make image first): %w", dir, err)
	}
	m, err := outer.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("failed to read %s/index.json: %w", dir, err)
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s holds %d entries, want the one index make image writes", dir, len(m.Manifests))
	}
	return outer.ImageIndex(m.Manifests[0].Digest)
}

// Push uploads idx to ref (registry/repository:tag) with the credentials of
// the user's Docker config (~/.docker/config.json, $DOCKER_CONFIG, and the
// credential helpers it names). Loopback and private-network registries are
// spoken to over plain HTTP, as go-containerregistry does for them.
func Push(ctx context.Context, idx v1.ImageIndex, ref string) (name.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, fmt.Errorf("invalid image reference %q (want registry/repository:tag): %w", ref, err)
	}
	if err := remote.WriteIndex(r, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return name.Digest{}, fmt.Errorf("failed to push %s: %w", r, err)
	}
	return digestRef(r, idx)
}

// PushImage uploads a single-platform image to ref, without credentials
// (the dev cluster's loopback registry needs none).
func PushImage(ctx context.Context, img v1.Image, ref string) (name.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return name.Digest{}, fmt.Errorf("failed to push %s: %w", r, err)
	}
	return digestRef(r, img)
}

func digestRef(r name.Reference, d interface{ Digest() (v1.Hash, error) }) (name.Digest, error) {
	h, err := d.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	out, err := name.NewDigest(r.Context().String() + "@" + h.String())
	if err != nil {
		return name.Digest{}, errors.Join(fmt.Errorf("failed to name the pushed digest"), err)
	}
	return out, nil
}
