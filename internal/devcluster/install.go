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

// install builds the Terrace image from the checkout, pushes it under every
// tag the kustomization names and under the binary's own version (the
// controller's default for runner pods and API servers), then applies the
// kustomization unchanged and waits until it is Current.
func (d *Dev) install(ctx context.Context, opts DevOptions, progress func(string)) error {
	if opts.TerraceBinary == "" {
		return errors.New("no terrace binary to build the Terrace image from")
	}
	tofu := opts.Tofu
	if tofu == "" {
		if tofu = FindTofu(); tofu == "" {
			return errors.New("no tofu binary for the Terrace image: run `make tools` or set TERRACE_TOFU")
		}
	}
	manifests, err := RenderKustomization(opts.Install)
	if err != nil {
		return err
	}
	own, err := binaryVersionTag(ctx, opts.TerraceBinary)
	if err != nil {
		return err
	}
	tags := []string{DevTag, own}
	for _, m := range imageTagPattern.FindAllSubmatch(manifests, -1) {
		if tag := string(m[1]); !slices.Contains(tags, tag) {
			tags = append(tags, tag)
		}
	}
	begin := time.Now()
	if _, err := d.Registry.PushDevImage(ctx, opts.TerraceBinary, tofu, tags...); err != nil {
		return err
	}
	d.Image = PublishedRegistry + "/" + ImageRepository + ":" + tags[len(tags)-1]
	opts.Log.Info("pushed the Terrace image", "tags", tags, "took", time.Since(begin).Round(time.Millisecond).String())
	if err := applyAndWait(ctx, d.Cluster.Config, opts.Install, manifests, progress); err != nil {
		return fmt.Errorf("failed to install %s: %w", opts.Install, err)
	}
	return nil
}
