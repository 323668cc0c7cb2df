package devnode

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	corev1 "k8s.io/api/core/v1"

	"github.com/terrace-dev/terrace/internal/image"
)

// testRegistry serves an in-process registry holding a Terrace image built
// from stand-in binaries as <host>/terrace-dev/terrace:dev, with gzip or
// uncompressed layers (as the dev cluster pushes).
func testRegistry(t *testing.T, compression int) (host string, stop func()) {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	dir := t.TempDir()
	p := image.Platform{OS: "linux", Architecture: runtime.GOARCH, Terrace: filepath.Join(dir, "terrace"), Tofu: filepath.Join(dir, "tofu")}
	for _, f := range []string{p.Terrace, p.Tofu} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\necho "+filepath.Base(f)+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img, err := image.BuildImage(image.Options{Version: "dev", CompressionLevel: compression}, p)
	if err != nil {
		t.Fatal(err)
	}
	host = strings.TrimPrefix(srv.URL, "http://")
	if _, err := image.PushImage(context.Background(), img, host+"/terrace-dev/terrace:dev"); err != nil {
		t.Fatal(err)
	}
	return host, srv.Close
}

func TestPullUnpacksOnceAndHonoursThePullPolicy(t *testing.T) {
	for name, compression := range map[string]int{"gzip": image.DefaultCompression, "uncompressed": image.Uncompressed} {
		t.Run(name, func(t *testing.T) { testPull(t, compression) })
	}
}

func testPull(t *testing.T, compression int) {
	host, stop := testRegistry(t, compression)
	store := newImageStore(t.TempDir(), map[string]string{"ghcr.io": host})
	ctx := context.Background()

	// ghcr.io is rewritten to the test registry.
	c := &corev1.Container{Name: "main", Image: "ghcr.io/terrace-dev/terrace:dev"}
	img, err := store.pull(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(img.id, "ghcr.io/terrace-dev/terrace@sha256:") {
		t.Errorf("image id %s, want the pod's repository at a digest", img.id)
	}
	if got := readFile(t, filepath.Join(img.rootfs, "usr/local/bin/terrace")); !strings.Contains(got, "terrace") {
		t.Errorf("the rootfs holds terrace %q", got)
	}
	if len(img.config.Entrypoint) != 1 || img.config.Entrypoint[0] != image.Entrypoint || img.config.WorkingDir != image.WorkDir {
		t.Errorf("config %+v", img.config)
	}

	// IfNotPresent (a tag other than latest) needs no registry any more;
	// Always does.
	stop()
	if again, err := store.pull(ctx, c); err != nil || again.rootfs != img.rootfs {
		t.Fatalf("IfNotPresent pulled again: %v (%v)", err, again)
	}
	always := &corev1.Container{Name: "main", Image: c.Image, ImagePullPolicy: corev1.PullAlways}
	if _, err := store.pull(ctx, always); !isPullError(err, ReasonErrImagePull) {
		t.Fatalf("PullAlways without a registry gave %v", err)
	}
	never := &corev1.Container{Name: "main", Image: "ghcr.io/terrace-dev/terrace:other", ImagePullPolicy: corev1.PullNever}
	if _, err := store.pull(ctx, never); !isPullError(err, ReasonErrImageNeverPull) {
		t.Fatalf("PullNever of an absent image gave %v", err)
	}
}

func TestPullOfAnUnknownImageIsErrImagePull(t *testing.T) {
	host, stop := testRegistry(t, image.DefaultCompression)
	defer stop()
	store := newImageStore(t.TempDir(), nil)
	for _, ref := range []string{host + "/terrace-dev/terrace:no-such-tag", host + "/no/such-image:v1"} {
		_, err := store.pull(context.Background(), &corev1.Container{Name: "main", Image: ref})
		if !isPullError(err, ReasonErrImagePull) || !strings.Contains(err.Error(), ref) {
			t.Errorf("%s: %v, want ErrImagePull naming the image", ref, err)
		}
	}
	if _, err := store.pull(context.Background(), &corev1.Container{Name: "main", Image: "Bad Name"}); !isPullError(err, ReasonInvalidImageName) {
		t.Errorf("an invalid name gave %v", err)
	}
	entries, _ := os.ReadDir(store.dir)
	if len(entries) != 0 {
		t.Errorf("failed pulls left %d entries in the image cache", len(entries))
	}
}

func isPullError(err error, reason string) bool {
	var pe *pullError
	return errors.As(err, &pe) && pe.reason == reason
}

func TestPruneRemovesImagesUnusedForADay(t *testing.T) {
	store := newImageStore(t.TempDir(), nil)
	old, recent := filepath.Join(store.dir, "sha256-old"), filepath.Join(store.dir, "sha256-recent")
	for _, d := range []string{old, recent} {
		if err := os.MkdirAll(filepath.Join(d, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	twoDaysAgo := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(old, twoDaysAgo, twoDaysAgo); err != nil {
		t.Fatal(err)
	}
	store.prune()
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("an image unused for two days is still there: %v", err)
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("a recent image was removed: %v", err)
	}
}
