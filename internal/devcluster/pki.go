package devcluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// certLifetime is long enough for any dev session; the PKI is recreated on
// every Start.
const certLifetime = 30 * 24 * time.Hour

// authority is the cluster's single CA: it signs the API server's serving
// certificate (so it doubles as the --root-ca-file published to pods) and
// every client certificate.
type authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "terrace-dev-ca"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("failed to self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("failed to parse CA: %w", err)
	}
	return &authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// keyPair is a PEM certificate and key.
type keyPair struct {
	certPEM []byte
	keyPEM  []byte
}

// issue signs a certificate. Client certificates carry the user in CN and
// the groups in O, as the API server's x509 authenticator reads them.
func (a *authority) issue(commonName string, groups []string, hosts []string, usage x509.ExtKeyUsage) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("failed to generate key for %s: %w", commonName, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: commonName, Organization: groups},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("failed to sign certificate for %s: %w", commonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM: keyPEM}, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("failed to encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}

// pkiFiles are the paths of everything the control plane reads.
type pkiFiles struct {
	caCert                      string
	apiserverCert, apiserverKey string
	kubeletClientCert           string
	kubeletClientKey            string
	controllerManagerCert       string
	controllerManagerKey        string
	serviceAccountKey           string
	serviceAccountPub           string
}

// pkiMaterial is what the Cluster keeps in memory for clients.
type pkiMaterial struct {
	files pkiFiles
	ca    *authority
	admin keyPair
	kcm   keyPair
}

// writePKI creates the CA, the serving and client certificates and the
// service-account signing key under dir.
// apiHosts are the API server's addresses besides its DNS names.
func writePKI(dir string, apiHosts []string) (*pkiMaterial, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", dir, err)
	}
	ca, err := newAuthority()
	if err != nil {
		return nil, err
	}
	serving, err := ca.issue("kube-apiserver", nil, append(apiHosts,
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	), x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	admin, err := ca.issue("terrace-dev-admin", []string{"system:masters"}, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	// The controller-manager runs its controllers under its own identity
	// (no --use-service-account-credentials), so it needs full rights.
	kcm, err := ca.issue("system:kube-controller-manager", []string{"system:masters"}, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	kubeletClient, err := ca.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	kcmServing, err := ca.issue("kube-controller-manager", nil, []string{"127.0.0.1", "localhost"}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate service-account key: %w", err)
	}
	saKeyPEM, err := encodeKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("failed to encode service-account public key: %w", err)
	}

	p := func(name string) string { return filepath.Join(dir, name) }
	files := pkiFiles{
		caCert:                p("ca.crt"),
		apiserverCert:         p("apiserver.crt"),
		apiserverKey:          p("apiserver.key"),
		kubeletClientCert:     p("apiserver-kubelet-client.crt"),
		kubeletClientKey:      p("apiserver-kubelet-client.key"),
		controllerManagerCert: p("controller-manager.crt"),
		controllerManagerKey:  p("controller-manager.key"),
		serviceAccountKey:     p("sa.key"),
		serviceAccountPub:     p("sa.pub"),
	}
	writes := map[string][]byte{
		files.caCert:                ca.certPEM,
		files.apiserverCert:         serving.certPEM,
		files.apiserverKey:          serving.keyPEM,
		files.kubeletClientCert:     kubeletClient.certPEM,
		files.kubeletClientKey:      kubeletClient.keyPEM,
		files.controllerManagerCert: kcmServing.certPEM,
		files.controllerManagerKey:  kcmServing.keyPEM,
		files.serviceAccountKey:     saKeyPEM,
		files.serviceAccountPub:     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	}
	for path, data := range writes {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("failed to write %s: %w", path, err)
		}
	}
	return &pkiMaterial{files: files, ca: ca, admin: admin, kcm: kcm}, nil
}

func certPool(certs ...*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}

func writeKubeconfig(path, server string, caPEM []byte, user keyPair, userName string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["terrace-dev"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[userName] = &clientcmdapi.AuthInfo{ClientCertificateData: user.certPEM, ClientKeyData: user.keyPEM}
	cfg.Contexts["terrace-dev"] = &clientcmdapi.Context{Cluster: "terrace-dev", AuthInfo: userName, Namespace: corev1.NamespaceDefault}
	cfg.CurrentContext = "terrace-dev"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("failed to write kubeconfig %s: %w", path, err)
	}
	return os.Chmod(path, 0o600)
}
