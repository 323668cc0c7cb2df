package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// The layout of a leaf in a Secret and in a directory where that Secret is
// mounted: a kubernetes.io/tls Secret plus the CA bundle.
const (
	LeafCertKey     = "tls.crt" // corev1.TLSCertKey
	LeafKeyKey      = "tls.key" // corev1.TLSPrivateKeyKey
	LeafCABundleKey = "ca.crt"
)

// SecretData returns the leaf as the data of a kubernetes.io/tls Secret with ca.crt.
func (l *Leaf) SecretData() map[string][]byte {
	return map[string][]byte{
		LeafCertKey:     bytes.Clone(l.CertPEM),
		LeafKeyKey:      bytes.Clone(l.KeyPEM),
		LeafCABundleKey: bytes.Clone(l.CABundlePEM),
	}
}

// LeafFromSecretData reads a leaf from Secret data laid out by SecretData.
func LeafFromSecretData(data map[string][]byte) (*Leaf, error) {
	l := &Leaf{CertPEM: data[LeafCertKey], KeyPEM: data[LeafKeyKey], CABundlePEM: data[LeafCABundleKey]}
	if err := l.check(); err != nil {
		return nil, err
	}
	return l, nil
}

// check verifies the parts parse and belong together.
func (l *Leaf) check() error {
	if _, err := l.TLSCertificate(); err != nil {
		return err
	}
	if _, err := parseCertificatesPEM(l.CABundlePEM); err != nil {
		return fmt.Errorf("failed to parse CA bundle: %w", err)
	}
	return nil
}

// TrustPool returns a pool of the leaf's CA bundle.
func (l *Leaf) TrustPool() (*x509.CertPool, error) {
	certs, err := parseCertificatesPEM(l.CABundlePEM)
	if err != nil {
		return nil, fmt.Errorf("failed to parse CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// WriteFiles writes the leaf into dir as tls.crt, tls.key and ca.crt, each
// replaced atomically.
func (l *Leaf) WriteFiles(dir string) error {
	for name, data := range l.SecretData() {
		tmp, err := os.CreateTemp(dir, "."+name+"-*")
		if err != nil {
			return fmt.Errorf("failed to write %s: %w", name, err)
		}
		_, werr := tmp.Write(data)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("failed to write %s: %w", name, err)
		}
		if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("failed to write %s: %w", name, err)
		}
	}
	return nil
}

// LoadLeafFiles reads tls.crt, tls.key and ca.crt from dir.
func LoadLeafFiles(dir string) (*Leaf, error) {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("failed to read leaf: %w", err)
		}
		return b, nil
	}
	var l Leaf
	var err error
	if l.CertPEM, err = read(LeafCertKey); err != nil {
		return nil, err
	}
	if l.KeyPEM, err = read(LeafKeyKey); err != nil {
		return nil, err
	}
	if l.CABundlePEM, err = read(LeafCABundleKey); err != nil {
		return nil, err
	}
	if err := l.check(); err != nil {
		return nil, fmt.Errorf("failed to load leaf from %s: %w", dir, err)
	}
	return &l, nil
}

// FileSource is a CertificateSource and TrustSource backed by a directory
// holding tls.crt, tls.key and ca.crt, such as a mounted Secret. It notices
// when the files change (the kubelet swaps a symlink when the Secret is
// updated) and serves the new leaf and CAs; while the files are half
// written it keeps serving the last complete set.
type FileSource struct {
	dir string

	mu    sync.Mutex
	stamp []os.FileInfo // of tls.crt, tls.key, ca.crt at the last load
	cert  *tls.Certificate
	pool  *x509.CertPool
}

// sameFile reports whether two stats are of one version of one file.
func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

// NewFileSource loads the leaf in dir; it fails when the files are missing or invalid.
func NewFileSource(dir string) (*FileSource, error) {
	f := &FileSource{dir: dir}
	if err := f.reload(f.stat()); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FileSource) stat() []os.FileInfo {
	stamps := make([]os.FileInfo, 0, 3)
	for _, name := range []string{LeafCertKey, LeafKeyKey, LeafCABundleKey} {
		// Stat follows the kubelet's ..data symlinks to the file of the moment;
		// a missing file yields nil, which never matches.
		info, _ := os.Stat(filepath.Join(f.dir, name))
		stamps = append(stamps, info)
	}
	return stamps
}

func (f *FileSource) reload(stamps []os.FileInfo) error {
	leaf, err := LoadLeafFiles(f.dir)
	if err != nil {
		return err
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		return err
	}
	pool, err := leaf.TrustPool()
	if err != nil {
		return err
	}
	f.cert, f.pool, f.stamp = &cert, pool, stamps
	return nil
}

// refresh reloads when any file changed since the last load.
func (f *FileSource) refresh() {
	stamps := f.stat()
	unchanged := true
	for i := range stamps {
		unchanged = unchanged && sameFile(stamps[i], f.stamp[i])
	}
	if unchanged {
		return
	}
	// A failed load (files mid-update) keeps the last good leaf; the next call retries.
	_ = f.reload(stamps)
}

// Certificate returns the leaf of the moment.
func (f *FileSource) Certificate() (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	return f.cert, nil
}

// TrustPool returns the CAs of the moment.
func (f *FileSource) TrustPool() *x509.CertPool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh()
	return f.pool
}
