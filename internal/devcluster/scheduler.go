package devcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"path/filepath"
	"strconv"
	"time"
)

// writeClientKubeconfig issues a client certificate for user (in groups) and
// writes a kubeconfig with it to path.
func (c *Cluster) writeClientKubeconfig(path, user string, groups ...string) error {
	kp, err := c.ca.issue(user, groups, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return err
	}
	return writeKubeconfig(path, c.APIServerURL, c.CACertPEM, kp, user)
}

// startScheduler runs kube-scheduler under its own identity
// (system:kube-scheduler, which the bootstrap RBAC policy binds) and waits
// until it is healthy.
func (c *Cluster) startScheduler(ctx context.Context, binDir string, port int) error {
	kubeconfig := filepath.Join(c.Dir, "pki", "scheduler.kubeconfig")
	if err := c.writeClientKubeconfig(kubeconfig, "system:kube-scheduler"); err != nil {
		return err
	}
	sched, err := c.launch("kube-scheduler", filepath.Join(binDir, "kube-scheduler"), []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(c.Dir, "scheduler"),
		"--leader-elect=false",
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	// Its serving certificate is self-signed: health is all that is asked.
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // a loopback health probe
	return waitReady(ctx, sched, clientGetter(insecure, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz"))
}
