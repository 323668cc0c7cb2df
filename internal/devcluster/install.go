package devcluster

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// imageTagPattern finds the Terrace image's tags in rendered manifests.
var imageTagPattern = regexp.MustCompile(regexp.QuoteMeta(PublishedRegistry+"/"+ImageRepository) + `:([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})`)

// ManifestImageTags lists the tags of the Terrace image that rendered
// manifests name, in order of first appearance.
func ManifestImageTags(manifests []byte) []string {
	var tags []string
	for _, m := range imageTagPattern.FindAllSubmatch(manifests, -1) {
		if tag := string(m[1]); !slices.Contains(tags, tag) {
			tags = append(tags, tag)
		}
	}
	return tags
}

// pushImage builds the Terrace image from the checkout and pushes it under
// DevTag, the binary's own version (the controller's default for runner
// pods and API servers) and every tag the manifests to install name.
func (d *Dev) pushImage(ctx context.Context, opts DevOptions, manifests []byte) error {
	tofu := opts.Tofu
	if tofu == "" {
		if tofu = FindTofu(); tofu == "" {
			return errors.New("no tofu binary for the Terrace image: run `make tools` or set TERRACE_TOFU")
		}
	}
	own, err := binaryVersionTag(ctx, opts.TerraceBinary)
	if err != nil {
		return err
	}
	tags := []string{DevTag, own}
	for _, tag := range append(ManifestImageTags(manifests), opts.ImageTags...) {
		if !slices.Contains(tags, tag) {
			tags = append(tags, tag)
		}
	}
	begin := time.Now()
	src := DevImage{Terrace: opts.TerraceBinary, Tofu: tofu, ProviderMirror: opts.ProviderMirror, Shell: opts.Shell}
	if _, err := d.Registry.PushDevImage(ctx, src, tags...); err != nil {
		return err
	}
	d.Image = PublishedRegistry + "/" + ImageRepository + ":" + tags[len(tags)-1]
	opts.Log.Info("pushed the Terrace image", "tags", tags, "took", time.Since(begin).Round(time.Millisecond).String())
	return nil
}

// install pushes the Terrace image, then applies the kustomization
// unchanged and waits until it is Current; with no kustomization, it only
// pushes the image (for a controller run as a process).
func (d *Dev) install(ctx context.Context, opts DevOptions, progress func(string)) error {
	if opts.TerraceBinary == "" {
		if opts.Install != "" {
			return errors.New("no terrace binary to build the Terrace image from")
		}
		return nil
	}
	var manifests []byte
	if opts.Install != "" {
		var err error
		if manifests, err = RenderKustomization(opts.Install); err != nil {
			return err
		}
	}
	if err := d.pushImage(ctx, opts, manifests); err != nil {
		return err
	}
	if opts.Install == "" {
		return nil
	}
	if err := applyAndWait(ctx, d.Cluster.Config, opts.Install, manifests, progress); err != nil {
		return fmt.Errorf("failed to install %s: %w", opts.Install, err)
	}
	return nil
}
