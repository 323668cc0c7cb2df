package devcluster

// The dev environment of devnode (host processes for pods), which the
// end-to-end tests still run on while they move to the real node
// (StartDev); it goes with internal/devnode.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/terrace-dev/terrace/internal/devnode"
)

// DevnodeOptions configure a dev environment: a control plane and a devnode.
type DevnodeOptions struct {
	// Dir holds everything: kubeconfig, cluster/ (control plane) and node/
	// (pods and logs). Both subdirectories are wiped on start. Required.
	Dir string
	// BinDir holds the control-plane binaries; FindBinDir when empty.
	BinDir string
	// CRDDirs are installed before the node starts.
	CRDDirs []string
	// TerraceBinary is the terrace binary built from the checkout. The
	// dev image is built from it and Tofu, pushed to the cluster's loopback
	// registry as terrace-dev/terrace:<ImageTags>, and devnode pulls
	// ghcr.io/terrace-dev/terrace from there. Required.
	TerraceBinary string
	// Tofu is the image's tofu binary; FindTofu when empty.
	Tofu string
	// ImageTags are the tags the dev image is pushed under; DevTag when
	// empty.
	ImageTags []string
	// HostBinary opts in to devnode running terrace-image containers with
	// TerraceBinary directly, without the image: quicker, for tests that
	// are not about the image.
	HostBinary bool
	// NodeName and PodSubnet are passed to devnode.
	NodeName, PodSubnet string
	// PodEnv is added to every pod container's environment.
	PodEnv []corev1.EnvVar
	// Log receives progress; discarded when unset.
	Log logr.Logger
	// Profiling is passed to the control plane (Options.Profiling).
	Profiling bool
}

// Devnode is a running control plane with a devnode.
type Devnode struct {
	Cluster *Cluster
	Node    *devnode.Node
	// KubeconfigPath is Dir/kubeconfig, an admin kubeconfig.
	KubeconfigPath string
	// NodeDir is the devnode's directory (pods/ and logs/).
	NodeDir string
	// Registry is the loopback registry holding the dev image, and Image
	// its reference there (nil and empty with HostBinary).
	Registry *Registry
	Image    string

	lock     *os.File
	stopNode context.CancelFunc
	nodeDone chan error
}

// StartDevnode locks opts.Dir (one dev environment per directory), starts the
// control plane, installs the CRDs and runs a devnode until Stop.
func StartDevnode(ctx context.Context, opts DevnodeOptions) (*Devnode, error) {
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	if opts.BinDir == "" {
		dir, err := FindBinDir()
		if err != nil {
			return nil, err
		}
		opts.BinDir = dir
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", opts.Dir, err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	d := &Devnode{lock: lock, KubeconfigPath: filepath.Join(opts.Dir, "kubeconfig"), NodeDir: filepath.Join(opts.Dir, "node")}
	if err := os.RemoveAll(d.NodeDir); err != nil {
		d.unlock()
		return nil, fmt.Errorf("failed to clear %s: %w", d.NodeDir, err)
	}
	cluster, err := Start(ctx, Options{BinDir: opts.BinDir, Dir: filepath.Join(opts.Dir, "cluster"), CRDDirs: opts.CRDDirs, Log: opts.Log, Profiling: opts.Profiling})
	if err != nil {
		d.unlock()
		return nil, err
	}
	d.Cluster = cluster
	kubeconfig, err := os.ReadFile(cluster.KubeconfigPath)
	if err == nil {
		err = os.WriteFile(d.KubeconfigPath, kubeconfig, 0o600)
	}
	if err != nil {
		_ = d.Stop()
		return nil, fmt.Errorf("failed to write %s: %w", d.KubeconfigPath, err)
	}
	certPEM, keyPEM, err := cluster.IssueServingCertificate("127.0.0.1", "localhost")
	if err != nil {
		_ = d.Stop()
		return nil, err
	}
	nodeOpts := devnode.Options{
		NodeName:       opts.NodeName,
		Dir:            d.NodeDir,
		ImageDir:       ImageCacheDir(),
		PodSubnet:      opts.PodSubnet,
		Env:            opts.PodEnv,
		ServingCertPEM: certPEM,
		ServingKeyPEM:  keyPEM,
		ClientCAPEM:    cluster.CACertPEM,
		Log:            opts.Log.WithName("devnode"),
	}
	if opts.HostBinary {
		nodeOpts.Binary = opts.TerraceBinary
	} else if err := d.startRegistry(ctx, opts); err != nil {
		_ = d.Stop()
		return nil, err
	} else {
		nodeOpts.RegistryRewrites = map[string]string{PublishedRegistry: d.Registry.Host}
	}
	node, err := devnode.New(cluster.Config, nodeOpts)
	if err != nil {
		_ = d.Stop()
		return nil, err
	}
	d.Node = node
	nodeCtx, stopNode := context.WithCancel(context.Background())
	d.stopNode, d.nodeDone = stopNode, make(chan error, 1)
	go func() { d.nodeDone <- node.Run(nodeCtx) }()
	select {
	case <-node.Ready():
	case err := <-d.nodeDone:
		d.nodeDone <- err
		_ = d.Stop()
		return nil, fmt.Errorf("devnode failed to start: %w", err)
	case <-ctx.Done():
		_ = d.Stop()
		return nil, fmt.Errorf("timed out starting devnode: %w", ctx.Err())
	}
	return d, nil
}

// Stop stops the devnode (and with it every pod process), then the control
// plane, and releases the directory.
func (d *Devnode) Stop() error {
	var errs []error
	if d.stopNode != nil {
		d.stopNode()
		if err := <-d.nodeDone; err != nil {
			errs = append(errs, fmt.Errorf("devnode: %w", err))
		}
		d.stopNode = nil
	}
	if d.Registry != nil {
		if err := d.Registry.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("registry: %w", err))
		}
		d.Registry = nil
	}
	if d.Cluster != nil {
		if err := d.Cluster.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	d.unlock()
	return errors.Join(errs...)
}

// startRegistry serves the loopback registry and pushes the dev image.
func (d *Devnode) startRegistry(ctx context.Context, opts DevnodeOptions) error {
	tofu := opts.Tofu
	if tofu == "" {
		if tofu = FindTofu(); tofu == "" {
			return errors.New("no tofu binary for the dev image: run `make tools` or set TERRACE_TOFU")
		}
	}
	dir := filepath.Join(opts.Dir, "registry")
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("failed to clear %s: %w", dir, err)
	}
	reg, err := StartRegistry(dir, "")
	if err != nil {
		return err
	}
	d.Registry = reg
	begin := time.Now()
	if d.Image, err = reg.PushDevImage(ctx, DevImage{Terrace: opts.TerraceBinary, Tofu: tofu}, opts.ImageTags...); err != nil {
		return err
	}
	opts.Log.Info("pushed the dev image", "image", d.Image, "took", time.Since(begin).Round(time.Millisecond).String())
	return nil
}

func (d *Devnode) unlock() {
	if d.lock != nil {
		_ = d.lock.Close()
		d.lock = nil
	}
}
