package image

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestLayoutRoundTrip(t *testing.T) {
	opts := testOptions(t, t.TempDir())
	idx, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "image")
	written, err := WriteLayout(dir, idx)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := back.Digest(); d != written {
		t.Fatalf("layout holds %s, wrote %s", d, written)
	}
	// Writing again replaces the layout: still one index in it.
	if _, err := WriteLayout(dir, idx); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLayout(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLayout(t.TempDir()); err == nil || !strings.Contains(err.Error(), "make image") {
		t.Fatalf("an empty directory read as a layout: %v", err)
	}
}

// authRegistry is go-containerregistry's in-process registry behind HTTP
// basic authentication, as a private registry is.
func authRegistry(t *testing.T, user, password string) string {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// dockerConfig makes the default keychain read a Docker config holding
// credentials for host (and nothing from the real home directory).
func dockerConfig(t *testing.T, host, user, password string) {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("REGISTRY_AUTH_FILE", "")
	dir := filepath.Join(home, ".docker")
	t.Setenv("DOCKER_CONFIG", dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	cfg := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestPushUsesTheDockerConfigCredentials(t *testing.T) {
	opts := testOptions(t, t.TempDir())
	idx, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	host := authRegistry(t, "ci", "s3cret")
	ref := host + "/team/terrace:v0.1.0"
	ctx := context.Background()

	dockerConfig(t, host, "ci", "wrong")
	if _, err := Push(ctx, idx, ref); err == nil {
		t.Fatal("pushed with wrong credentials")
	} else if strings.Contains(err.Error(), "wrong") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the error shows a password: %v", err)
	}

	dockerConfig(t, host, "ci", "s3cret")
	pushed, err := Push(ctx, idx, ref)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()
	if pushed.DigestStr() != want.String() || pushed.Context().String() != host+"/team/terrace" {
		t.Fatalf("push reported %s, want %s@%s", pushed, host+"/team/terrace", want)
	}
	tag, _ := name.ParseReference(ref)
	got, err := remote.Index(tag, remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != want {
		t.Fatalf("the registry serves %s under the tag, pushed %s", d, want)
	}
	// Each platform's image is in the registry too.
	m, _ := got.IndexManifest()
	for _, desc := range m.Manifests {
		img, err := got.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := img.ConfigFile(); err != nil {
			t.Fatalf("%s: %v", desc.Platform, err)
		}
	}

	if _, err := Push(ctx, idx, "Not A Reference"); err == nil || !strings.Contains(err.Error(), "registry/repository:tag") {
		t.Fatalf("a bad reference gave %v", err)
	}
}
