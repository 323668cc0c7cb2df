// Package devcluster runs a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager) as local processes from the
// binaries `make tools` builds, for `terrace dev` and end-to-end tests.
//
// Every Start is a fresh cluster on free loopback ports with its own PKI: one
// CA signs the API server's serving certificate and the client certificates,
// authorization is RBAC (the admin is in system:masters), and service-account
// tokens are signed by a key the controller-manager shares, so ServiceAccounts,
// the garbage collector and the ReplicaSet, Deployment and namespace
// controllers behave as in a real cluster. StartDev adds the real node
// (node.go) and the scheduler.
package devcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	// serviceIP is the first address of the service range, the API server's
	// own "kubernetes" Service.
	serviceIP    = "10.0.0.1"
	serviceRange = "10.0.0.0/24"
	// ServiceAccountIssuer is the issuer of every service-account token.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

	stopGrace = 10 * time.Second
)

// Options say where the binaries are and where the cluster keeps its files.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager (the
	// KUBEBUILDER_ASSETS directory that `make tools` fills).
	BinDir string
	// Dir receives etcd data, PKI, logs and the admin kubeconfig. Its
	// cluster subdirectories are recreated on Start. When empty a temporary
	// directory is used and removed by Stop.
	Dir string
	// CRDDirs hold CustomResourceDefinition manifests to install (and wait
	// Established) before Start returns.
	CRDDirs []string
	// StartTimeout bounds the whole start; 90 s when zero.
	StartTimeout time.Duration
	// Log receives progress lines; discarded when unset.
	Log logr.Logger
	// Profiling serves kube-apiserver's /debug/pprof to admin clients, for
	// benchmarks that ask where the API server's CPU goes (APIServerProfile).
	Profiling bool

	// nodeNet, set by StartDev, serves the API server on the host's end of
	// the node's link (where the node and its pods reach it, through the
	// kubernetes Service too) instead of loopback, with that Service range,
	// and adds the scheduler and every controller a node needs.
	nodeNet *network
	// nodeBinDir holds kube-scheduler when nodeNet is set.
	nodeBinDir string
}

// Cluster is a running control plane.
type Cluster struct {
	// Dir holds everything the cluster wrote.
	Dir string
	// KubeconfigPath is an admin kubeconfig (embedded certificates).
	KubeconfigPath string
	// Config is the admin client configuration.
	Config *rest.Config
	// CACertPEM is the CA that signs the API server's certificate and the
	// client certificates the API server accepts. It is also the ca.crt that
	// pods receive in kube-root-ca.crt.
	CACertPEM []byte
	// APIServerURL is https://127.0.0.1:<port>.
	APIServerURL string
	// EtcdURL is etcd's plain-HTTP client URL on loopback (its /metrics
	// say its database's size).
	EtcdURL string

	ca        *authority
	procs     []*process // start order: etcd, kube-apiserver, kube-controller-manager
	removeDir bool
	log       logr.Logger
}

// Start launches etcd, kube-apiserver and kube-controller-manager, waits
// until they are ready and the controllers have created the default
// ServiceAccount, and installs the CRDs from opts.CRDDirs. A process that
// dies during start is reported with the last lines of its log. When ctx
// ends the start is abandoned and everything started is stopped.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 90 * time.Second
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, bin)); err != nil {
			return nil, fmt.Errorf("%s is missing from %q: run `make tools` (a cold build takes ~25 minutes) or set KUBEBUILDER_ASSETS", bin, opts.BinDir)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	c := &Cluster{Dir: opts.Dir, log: opts.Log}
	if c.Dir == "" {
		dir, err := os.MkdirTemp("", "terrace-devcluster-")
		if err != nil {
			return nil, fmt.Errorf("failed to create cluster directory: %w", err)
		}
		c.Dir, c.removeDir = dir, true
	}
	// Ports are probed free and then handed to the binaries, so another
	// process can take one in between; such a start is retried.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		err = c.start(ctx, opts)
		if err == nil || !strings.Contains(err.Error(), "address already in use") || ctx.Err() != nil {
			break
		}
		c.log.Info("a port was taken while starting, retrying", "attempt", attempt)
	}
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, opts Options) error {
	c.stopProcesses()
	for _, sub := range []string{"etcd", "pki", "logs", "apiserver", "flexvolume", "scheduler"} {
		if err := os.RemoveAll(filepath.Join(c.Dir, sub)); err != nil {
			return fmt.Errorf("failed to clear %s: %w", sub, err)
		}
		if err := os.MkdirAll(filepath.Join(c.Dir, sub), 0o700); err != nil {
			return fmt.Errorf("failed to create %s: %w", sub, err)
		}
	}
	apiHosts, svcRange, bindIP := []string{"127.0.0.1", "localhost", serviceIP}, serviceRange, "127.0.0.1"
	if n := opts.nodeNet; n != nil {
		apiHosts, svcRange, bindIP = []string{n.HostIP.String(), n.APIServiceIP.String()}, n.ServiceCIDR.String(), n.HostIP.String()
	}
	pki, err := writePKI(filepath.Join(c.Dir, "pki"), apiHosts)
	if err != nil {
		return err
	}
	c.ca, c.CACertPEM = pki.ca, pki.ca.certPEM
	ports, err := FreePorts("127.0.0.1", 4)
	if err != nil {
		return err
	}
	etcdPort, peerPort, kcmPort, schedulerPort := ports[0], ports[1], ports[2], ports[3]
	apiPorts, err := FreePorts(bindIP, 1)
	if err != nil {
		return err
	}
	apiPort := apiPorts[0]
	c.APIServerURL = "https://" + net.JoinHostPort(bindIP, strconv.Itoa(apiPort))
	c.Config = &rest.Config{
		Host: c.APIServerURL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   pki.ca.certPEM,
			CertData: pki.admin.certPEM,
			KeyData:  pki.admin.keyPEM,
		},
		QPS:   100,
		Burst: 200,
	}
	c.KubeconfigPath = filepath.Join(c.Dir, "kubeconfig")
	if err := writeKubeconfig(c.KubeconfigPath, c.APIServerURL, pki.ca.certPEM, pki.admin, "terrace-dev-admin"); err != nil {
		return err
	}
	kcmKubeconfig := filepath.Join(c.Dir, "pki", "controller-manager.kubeconfig")
	if err := writeKubeconfig(kcmKubeconfig, c.APIServerURL, pki.ca.certPEM, pki.kcm, "system:kube-controller-manager"); err != nil {
		return err
	}

	begin := time.Now()
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	c.EtcdURL = etcdURL
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	etcd, err := c.launch("etcd", filepath.Join(opts.BinDir, "etcd"), []string{
		"--name=default",
		"--data-dir=" + filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	})
	if err != nil {
		return err
	}
	if err := waitReady(ctx, etcd, plainGetter(etcdURL+"/health")); err != nil {
		return err
	}

	f := pki.files
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + bindIP,
		"--advertise-address=" + bindIP,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(c.Dir, "apiserver"),
		"--tls-cert-file=" + f.apiserverCert,
		"--tls-private-key-file=" + f.apiserverKey,
		"--client-ca-file=" + f.caCert,
		// The Node authorizer and NodeRestriction confine the kubelet to
		// its own node's objects, as on any real cluster.
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + f.serviceAccountPub,
		"--service-account-signing-key-file=" + f.serviceAccountKey,
		"--service-cluster-ip-range=" + svcRange,
		"--allow-privileged=true",
		// `kubectl logs` and `exec` reach the kubelet with this identity.
		"--kubelet-client-certificate=" + f.kubeletClientCert,
		"--kubelet-client-key=" + f.kubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-certificate-authority=" + f.caCert,
		"--profiling=" + strconv.FormatBool(opts.Profiling),
	}
	if opts.nodeNet == nil {
		// Fatal in 1.37 without it when advertising a loopback address.
		apiArgs = append(apiArgs, "--endpoint-reconciler-type=none")
	}
	api, err := c.launch("kube-apiserver", filepath.Join(opts.BinDir, "kube-apiserver"), apiArgs)
	if err != nil {
		return err
	}
	adminHTTP, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return fmt.Errorf("failed to build admin HTTP client: %w", err)
	}
	if err := waitReady(ctx, api, clientGetter(adminHTTP, c.APIServerURL+"/readyz")); err != nil {
		return err
	}
	c.log.Info("api server ready", "url", c.APIServerURL, "after", time.Since(begin).Round(time.Millisecond))
	// CRDs install while the controller-manager starts.
	crdsDone := make(chan error, 1)
	go func() {
		if len(opts.CRDDirs) == 0 {
			crdsDone <- nil
			return
		}
		crdsDone <- c.InstallCRDs(ctx, opts.CRDDirs...)
	}()

	// Without a node, the controllers pods and Deployments need; with one,
	// every controller a user's workloads and the node's lifecycle need.
	controllers := "garbagecollector,replicaset,deployment,namespace,serviceaccount,serviceaccount-token,root-ca-cert-publisher"
	if opts.nodeNet != nil {
		controllers = "*"
	}
	kcm, err := c.launch("kube-controller-manager", filepath.Join(opts.BinDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + kcmKubeconfig,
		"--authentication-kubeconfig=" + kcmKubeconfig,
		"--authorization-kubeconfig=" + kcmKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(kcmPort),
		"--tls-cert-file=" + f.controllerManagerCert,
		"--tls-private-key-file=" + f.controllerManagerKey,
		"--controllers=" + controllers,
		"--service-cluster-ip-range=" + svcRange,
		"--flex-volume-plugin-dir=" + filepath.Join(c.Dir, "flexvolume"),
		"--service-account-private-key-file=" + f.serviceAccountKey,
		"--root-ca-file=" + f.caCert,
		"--leader-elect=false",
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	kcmHTTP := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certPool(pki.ca.cert), MinVersion: tls.VersionTLS12}}}
	if err := waitReady(ctx, kcm, clientGetter(kcmHTTP, "https://127.0.0.1:"+strconv.Itoa(kcmPort)+"/healthz")); err != nil {
		return err
	}
	// Pods are refused until their namespace's ServiceAccount exists, and
	// their token volume needs kube-root-ca.crt: wait for both controllers.
	if err := c.waitControllers(ctx, kcm); err != nil {
		return err
	}
	if opts.nodeNet != nil {
		if err := c.startScheduler(ctx, opts.nodeBinDir, schedulerPort); err != nil {
			return err
		}
	}
	if err := <-crdsDone; err != nil {
		return err
	}
	c.log.Info("control plane ready", "after", time.Since(begin).Round(time.Millisecond), "kubeconfig", c.KubeconfigPath)
	return nil
}

func (c *Cluster) launch(name, bin string, args []string) (*process, error) {
	p, err := startProcess(name, bin, args, filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	c.log.V(1).Info("started", "process", name, "pid", p.Pid())
	return p, nil
}

func (c *Cluster) waitControllers(ctx context.Context, kcm *process) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("failed to create clientset: %w", err)
	}
	return pollUntil(ctx, kcm, func(ctx context.Context) (bool, error) {
		if _, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, ignoreNotFound(err)
		}
		if _, err := cs.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
			return false, ignoreNotFound(err)
		}
		return true, nil
	}, "the default ServiceAccount and kube-root-ca.crt ConfigMap")
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Pids lists the control-plane processes still running.
func (c *Cluster) Pids() []int {
	var pids []int
	for _, p := range c.procs {
		if !p.exited() {
			pids = append(pids, p.Pid())
		}
	}
	return pids
}

// LogPath is the log file of one component: etcd, kube-apiserver or
// kube-controller-manager.
func (c *Cluster) LogPath(component string) string {
	return filepath.Join(c.Dir, "logs", component+".log")
}

// Stop ends the processes in reverse start order (SIGTERM, then SIGKILL
// after a grace period) and removes a temporary directory. It is safe to
// call more than once.
func (c *Cluster) Stop() error {
	c.stopProcesses()
	if c.removeDir {
		if err := os.RemoveAll(c.Dir); err != nil {
			return fmt.Errorf("failed to remove %s: %w", c.Dir, err)
		}
	}
	return nil
}

func (c *Cluster) stopProcesses() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(stopGrace)
	}
	c.procs = nil
}
