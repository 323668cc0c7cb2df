package devcluster

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/terrace-dev/terrace/internal/image"
	"github.com/terrace-dev/terrace/internal/runnerbin"
)

// ImageRepository is the repository of the Terrace image, as published;
// the dev cluster pushes its own build under the same path to its registry,
// which the node's containerd pulls every registry's images from.
const (
	PublishedRegistry = "ghcr.io"
	ImageRepository   = "terrace-dev/terrace"
	// DevTag is the tag of the image built from the checkout.
	DevTag = "dev"
)

// Registry is an OCI registry on a loopback port (go-containerregistry's
// registry package) with its blobs on disk, in this process.
type Registry struct {
	// Host is host:port on loopback, such as 127.0.0.1:41234, where this
	// machine pushes (go-containerregistry speaks plain HTTP to loopback).
	Host string
	// NodeHost is host:port on the host's end of the node's link, where
	// the node's containerd pulls; empty without a node.
	NodeHost string
	srv      *http.Server
	done     chan error
	serving  int
}

// StartRegistry serves a registry on a free 127.0.0.1 port and, when
// nodeIP is set, on a free port of that address too, keeping blobs under
// dir.
func StartRegistry(dir, nodeIP string) (*Registry, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", dir, err)
	}
	addrs := []string{"127.0.0.1:0"}
	if nodeIP != "" {
		addrs = append(addrs, net.JoinHostPort(nodeIP, "0"))
	}
	var listeners []net.Listener
	for _, addr := range addrs {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return nil, fmt.Errorf("failed to listen for the registry: %w", err)
		}
		listeners = append(listeners, lis)
	}
	handler := registry.New(
		registry.WithBlobHandler(registry.NewDiskBlobHandler(dir)),
		registry.Logger(log.New(io.Discard, "", 0)),
	)
	r := &Registry{
		Host:    listeners[0].Addr().String(),
		srv:     &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second},
		done:    make(chan error, len(listeners)),
		serving: len(listeners),
	}
	if len(listeners) > 1 {
		r.NodeHost = listeners[1].Addr().String()
	}
	for _, lis := range listeners {
		go func() { r.done <- r.srv.Serve(lis) }()
	}
	return r, nil
}

// Stop closes the registry.
func (r *Registry) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.srv.Shutdown(ctx)
	for range r.serving {
		if serveErr := <-r.done; !errors.Is(serveErr, http.ErrServerClosed) {
			err = errors.Join(err, serveErr)
		}
	}
	return err
}

// DevImage is what the dev image is built from: static terrace and tofu
// binaries of the host's platform (a terrace-runner beside terrace of the
// same build goes in too) and, optionally, a provider mirror directory baked
// in at image.ProviderMirrorDir.
type DevImage struct {
	Terrace, Tofu  string
	ProviderMirror string
	// Shell is a static busybox giving the image /bin/sh (image.Platform.Shell).
	Shell string
}

// PushDevImage builds the image of the host's platform from src
// (uncompressed layers: it never leaves the machine) and pushes it to the
// registry as <host>/terrace-dev/terrace:<tag> for each tag; with no tags,
// as DevTag, as the binary's own version and as latest, the tags the
// controller's image defaults may name. It returns the reference of the
// first tag.
func (r *Registry) PushDevImage(ctx context.Context, src DevImage, tags ...string) (string, error) {
	for _, bin := range []string{src.Terrace, src.Tofu} {
		if err := requireStatic(bin); err != nil {
			return "", err
		}
	}
	if len(tags) == 0 {
		own, err := binaryVersionTag(ctx, src.Terrace)
		if err != nil {
			return "", err
		}
		tags = []string{DevTag, own, "latest"}
	}
	p := image.Platform{OS: "linux", Architecture: runtime.GOARCH, Terrace: src.Terrace, Tofu: src.Tofu, ProviderMirror: src.ProviderMirror, Shell: src.Shell}
	// The lean runner binary beside terrace (make build puts it there),
	// if it was built from the same source; else the image links
	// terrace-runner to terrace.
	if runner := filepath.Join(filepath.Dir(src.Terrace), runnerbin.Name); sameBuild(src.Terrace, runner) {
		p.Runner = runner
	}
	img, err := image.BuildImage(image.Options{Version: tags[0], CompressionLevel: image.Uncompressed}, p)
	if err != nil {
		return "", fmt.Errorf("failed to build the dev image: %w", err)
	}
	var first string
	for _, tag := range tags {
		ref := r.Host + "/" + ImageRepository + ":" + tag
		if _, err := image.PushImage(ctx, img, ref); err != nil {
			return "", err
		}
		if first == "" {
			first = ref
		}
	}
	return first, nil
}

// requireStatic refuses a dynamically linked binary: the image has no C
// library, so it would fail in every container with "no such file".
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked and cannot run in the image: build it with CGO_ENABLED=0 (make build does)", path)
		}
	}
	return nil
}

// binaryVersionTag is the image tag the terrace binary takes as its own
// (`terrace version`: the controller defaults runner and API server images
// to ghcr.io/terrace-dev/terrace:<version>), so the dev registry answers for
// it too. Characters a tag cannot hold become '-', as the version package
// does.
func binaryVersionTag(ctx context.Context, terrace string) (string, error) {
	out, err := exec.CommandContext(ctx, terrace, "version", "--json").Output()
	if err != nil {
		return "", fmt.Errorf("failed to ask %s its version: %w", terrace, err)
	}
	var info struct{ Version string }
	if err := json.Unmarshal(out, &info); err != nil || info.Version == "" {
		return "", fmt.Errorf("%s version --json printed %q", terrace, out)
	}
	tag := []byte(info.Version)
	for i, c := range tag {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			tag[i] = '-'
		}
	}
	if tag[0] == '.' || tag[0] == '-' {
		tag = append([]byte("v"), tag...)
	}
	return string(tag[:min(len(tag), 128)]), nil
}

// sameBuild reports whether the Go binaries a and b were built from the same
// source: one revision, in the same state, with the same linker flags (the
// version). A terrace-runner left from an older build beside a new terrace
// would otherwise run every run with old code. Uncommitted changes to the
// same revision are alike to it.
func sameBuild(a, b string) bool {
	infoA, err := buildinfo.ReadFile(a)
	if err != nil {
		return false
	}
	infoB, err := buildinfo.ReadFile(b)
	if err != nil {
		return false
	}
	return buildKey(infoA) == buildKey(infoB)
}

func buildKey(info *debug.BuildInfo) string {
	var key []string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision", "vcs.time", "vcs.modified", "-ldflags":
			key = append(key, s.Key+"="+s.Value)
		}
	}
	return info.GoVersion + " " + strings.Join(key, " ")
}
