package pki

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLeafSecretDataRoundTrip(t *testing.T) {
	a := mustAuthority(t, Options{})
	leaf := issue(t, a, testRunner, time.Hour)
	data := leaf.SecretData()
	for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if len(data[k]) == 0 {
			t.Fatalf("Secret data lacks %s", k)
		}
	}
	back, err := LeafFromSecretData(data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.CertPEM, leaf.CertPEM) || !bytes.Equal(back.KeyPEM, leaf.KeyPEM) || !bytes.Equal(back.CABundlePEM, leaf.CABundlePEM) {
		t.Fatal("leaf changed through Secret data")
	}
	other := issue(t, a, testRunner, time.Hour)
	data[LeafKeyKey] = other.KeyPEM
	if _, err := LeafFromSecretData(data); err == nil {
		t.Fatal("accepted a key that does not match the certificate")
	}
	if _, err := LeafFromSecretData(map[string][]byte{LeafCertKey: leaf.CertPEM, LeafKeyKey: leaf.KeyPEM}); err == nil {
		t.Fatal("accepted a leaf without CA bundle")
	}
}

// kubeletMount lays out dir as the kubelet does for a Secret volume: the
// files are symlinks through ..data to a timestamped directory, and an
// update swaps ..data atomically.
type kubeletMount struct {
	t       *testing.T
	dir     string
	version int
}

func newKubeletMount(t *testing.T, leaf *Leaf) *kubeletMount {
	m := &kubeletMount{t: t, dir: t.TempDir()}
	m.update(leaf.SecretData())
	for _, name := range []string{LeafCertKey, LeafKeyKey, LeafCABundleKey} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func (m *kubeletMount) update(data map[string][]byte) {
	m.version++
	versionDir := filepath.Join(m.dir, fmt.Sprintf("..v%d", m.version))
	if err := os.Mkdir(versionDir, 0o755); err != nil {
		m.t.Fatal(err)
	}
	for name, content := range data {
		if err := os.WriteFile(filepath.Join(versionDir, name), content, 0o600); err != nil {
			m.t.Fatal(err)
		}
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(versionDir), tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
}

// TestFileSourceFollowsMountedSecret: a runner serving from a mounted Secret
// picks up a renewed leaf and CA bundle without restarting, and keeps the
// last complete leaf while files are inconsistent.
func TestFileSourceFollowsMountedSecret(t *testing.T) {
	a := mustAuthority(t, Options{})
	first := issue(t, a, testRunner, time.Hour)
	mount := newKubeletMount(t, first)
	src, err := NewFileSource(mount.dir)
	if err != nil {
		t.Fatal(err)
	}
	controller := mustIssue(t, a, ControllerIdentity)
	server := ServerTLSConfig(src, src, RequireIdentity(ControllerIdentity))
	res := handshake(t, server, controllerClient(&controller, a, testRunner))
	if !res.ok() {
		t.Fatalf("handshake with mounted leaf: server %v, client %v", res.serverErr, res.clientErr)
	}
	if got, _ := src.Certificate(); !bytes.Equal(got.Certificate[0], mustDER(t, first)) {
		t.Fatal("file source does not serve the mounted leaf")
	}

	// The Secret is updated with a leaf from a new CA: both the leaf and the trust follow.
	b := mustAuthority(t, Options{})
	second := issue(t, b, testRunner, time.Hour)
	mount.update(second.SecretData())
	if got, _ := src.Certificate(); !bytes.Equal(got.Certificate[0], mustDER(t, second)) {
		t.Fatal("file source did not reload the updated leaf")
	}
	res = handshake(t, server, controllerClient(&controller, a, testRunner))
	if res.ok() {
		t.Fatal("the old CA is still trusted after the mounted bundle dropped it")
	}
	controllerB := mustIssue(t, b, ControllerIdentity)
	res = handshake(t, server, controllerClient(&controllerB, b, testRunner))
	if !res.ok() {
		t.Fatalf("handshake after reload: server %v, client %v", res.serverErr, res.clientErr)
	}

	// A half-written update (key of another leaf) is not served.
	third := issue(t, b, testRunner, time.Hour)
	broken := second.SecretData()
	broken[LeafKeyKey] = third.KeyPEM
	mount.update(broken)
	if got, _ := src.Certificate(); !bytes.Equal(got.Certificate[0], mustDER(t, second)) {
		t.Fatal("file source replaced a good leaf with an inconsistent one")
	}
}

func TestWriteFilesAndLoad(t *testing.T) {
	a := mustAuthority(t, Options{})
	leaf := issue(t, a, ControllerIdentity, time.Hour)
	dir := t.TempDir()
	if err := leaf.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadLeafFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(loaded.CertPEM, leaf.CertPEM) || !bytes.Equal(loaded.CABundlePEM, leaf.CABundlePEM) {
		t.Fatal("leaf changed through files")
	}
	if _, err := LoadLeafFiles(t.TempDir()); err == nil {
		t.Fatal("loaded a leaf from an empty directory")
	}
}

func mustDER(t *testing.T, l *Leaf) []byte {
	t.Helper()
	c, err := l.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	return c.Raw
}
