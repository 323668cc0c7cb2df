package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/image"
	"github.com/terrace-dev/terrace/internal/operator"
)

type devOptions struct {
	dir           string
	demo          bool
	demoTimeout   time.Duration
	examplesDir   string
	installDir    string
	terraceBinary string
	nodeName      string
	verbose       int
	// controllerProcess runs the controller in this process instead of
	// installing it, for debugging. providerMirror is a host directory
	// baked into the image, which the controller's runners then install
	// providers from.
	controllerProcess bool
	providerMirror    string
}

func defaultDevDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "terrace", "dev")
}

func newDevCommand() *cobra.Command {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local single-node cluster (no Docker) with Terrace installed",
		Long: "terrace dev starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and a real node\n" +
			"(containerd with runc, the kubelet, kube-proxy, CNI bridge networking) in network, mount and PID\n" +
			"namespaces of its own, from the binaries `make tools` builds; then CoreDNS, and Terrace from\n" +
			"config/default with the image built from this binary, served by a registry on the node's link.\n" +
			"It runs until Ctrl-C, and must run as root. The admin kubeconfig is written to <dir>/kubeconfig.\n" +
			"With --demo it applies the examples, waits for them and prints the results. See docs/dev-cluster.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDev(ctx, cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", defaultDevDir(), "directory for the kubeconfig, cluster data, node files and logs (wiped on start)")
	f.BoolVar(&o.demo, "demo", false, "apply the examples, wait until they are Ready, print the results and exit")
	f.DurationVar(&o.demoTimeout, "demo-timeout", 10*time.Minute, "how long --demo waits for the examples")
	f.StringVar(&o.examplesDir, "examples", "examples", "manifests --demo applies (looked up from the current directory upwards)")
	f.StringVar(&o.installDir, "install", filepath.Join("config", "default"), "kustomization that installs Terrace (looked up from the current directory upwards)")
	f.StringVar(&o.terraceBinary, "terrace-binary", "", "terrace binary the Terrace image is built from, with the terrace-runner beside it (if any) and tofu (default: this binary)")
	f.StringVar(&o.nodeName, "node-name", "terrace-dev", "name of the Node (and the node's hostname)")
	f.BoolVar(&o.controllerProcess, "controller-process", false, "run the controller in this process instead of installing it (for debugging); only the CRDs are installed")
	f.StringVar(&o.providerMirror, "runner-provider-mirror", os.Getenv("TERRACE_PROVIDER_MIRROR"), "with --controller-process: a provider mirror directory baked into the image, from which runner pods install providers [TERRACE_PROVIDER_MIRROR]")
	f.IntVarP(&o.verbose, "verbose", "v", 0, "also print the log on stderr, at this verbosity (-v is 1); it is always in <dir>/"+devLogName)
	f.Lookup("verbose").NoOptDefVal = "1"
	cmd.AddCommand(newDevPodFixtureCommand())
	return cmd
}

// findUpwards returns path when it exists relative to the current directory
// or one of its parents, so `terrace dev` works from anywhere in a checkout.
func findUpwards(path string) (string, error) {
	if filepath.IsAbs(path) {
		return path, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		candidate := filepath.Join(dir, path)
		if _, err := os.Stat(candidate); err == nil {
			return candidate, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found in the current directory or its parents: run from the Terrace checkout or pass its path", path)
		}
		dir = parent
	}
}

func devLogger(w io.Writer, verbosity int) logr.Logger {
	return funcr.New(func(prefix, args string) {
		fmt.Fprintln(w, time.Now().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: verbosity})
}

// devLogName is the file in the dev directory that receives the full log
// of the control plane, the node and the controller (truncated on start).
const devLogName = "terrace-dev.log"

// openDevLog creates dir and its log file. The log goes only to the file
// unless verbose, so the terminal shows progress and results; with -v it
// goes to stderr too.
func openDevLog(dir string, verbose int) (logr.Logger, string, func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return logr.Logger{}, "", nil, fmt.Errorf("failed to create %s: %w", dir, err)
	}
	path := filepath.Join(dir, devLogName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return logr.Logger{}, "", nil, fmt.Errorf("failed to create the log file: %w", err)
	}
	var w io.Writer = f
	if verbose > 0 {
		w = io.MultiWriter(os.Stderr, f)
	}
	// The file keeps the run logs (V(1)) whatever the terminal shows.
	log := devLogger(w, max(verbose, 1))
	// client-go and controller-runtime internals log through klog and
	// controller-runtime's own logger (whose first use, unset, prints a
	// warning with a stack trace on the terminal).
	klog.SetLogger(log)
	ctrl.SetLogger(log)
	return log, path, func() { _ = f.Close() }, nil
}

func runDev(ctx context.Context, out io.Writer, o devOptions) error {
	begin := time.Now()
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	log, logPath, closeLog, err := openDevLog(dir, o.verbose)
	if err != nil {
		return err
	}
	defer closeLog()
	if o.terraceBinary == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("failed to find this binary: %w", err)
		}
		o.terraceBinary = self
	}
	install, err := findUpwards(o.installDir)
	if err != nil {
		return err
	}
	var examples string
	if o.demo {
		if examples, err = findUpwards(o.examplesDir); err != nil {
			return err
		}
	}
	binDir, err := devcluster.FindBinDir()
	if err != nil {
		return err
	}
	opts := devcluster.DevOptions{
		Dir:           dir,
		BinDir:        binDir,
		TerraceBinary: o.terraceBinary,
		Install:       install,
		NodeName:      o.nodeName,
		Log:           log,
	}
	what := "Terrace from " + install
	if o.controllerProcess {
		opts.Install = ""
		opts.CRDDirs = []string{filepath.Join(install, "..", "crd", "bases")}
		opts.ProviderMirror = o.providerMirror
		what = "the CRDs, the controller in this process"
	}
	fmt.Fprintf(out, "terrace dev: starting the control plane, a node (containerd, kubelet, kube-proxy), CoreDNS and %s (full log: %s)\n", what, logPath)
	startCtx, cancelStart := context.WithTimeout(ctx, devcluster.StartupTimeout)
	dev, err := devcluster.StartDev(startCtx, opts)
	cancelStart()
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping: node and pods, scheduler, controller-manager, api server, etcd")
		if err := dev.Stop(); err != nil {
			log.Error(err, "failed to stop cleanly")
		}
	}()

	controllerDone := make(chan error, 1)
	if o.controllerProcess {
		controllerCtx, stopController := context.WithCancel(ctx)
		go func() {
			controllerDone <- runDevController(controllerCtx, dev.Cluster.Config, log, dev.Node.HostIP(), o.providerMirror != "")
		}()
		defer func() {
			stopController()
			if err := <-controllerDone; err != nil {
				log.Error(err, "controller stopped with an error")
			}
		}()
	}

	fmt.Fprintf(out, "terrace dev: ready in %.1fs (node %s at %s, pods %s, logs under %s)\n",
		time.Since(begin).Seconds(), dev.Node.Name(), dev.Node.IP(), dev.Node.PodCIDR(), dev.Node.LogDir())
	if dev.Image != "" {
		fmt.Fprintf(out, "image: %s, built from %s (the node pulls every image from the registry at %s)\n", dev.Image, o.terraceBinary, dev.Registry.NodeHost)
	}
	fmt.Fprintf(out, "registry: %s (push your own images here as <name>:<tag>; the node resolves every registry's <name>:<tag> to it)\n", dev.Registry.Host)
	fmt.Fprintf(out, "export KUBECONFIG=%s\n", dev.KubeconfigPath)

	if o.demo {
		return runDemo(ctx, out, dev, examples, o.demoTimeout, controllerDone)
	}
	fmt.Fprintln(out, "press Ctrl-C to stop")
	select {
	case <-ctx.Done():
		return nil
	case err := <-controllerDone:
		controllerDone <- err
		if err != nil {
			return fmt.Errorf("controller stopped: %w", err)
		}
		<-ctx.Done()
		return nil
	}
}

// devControllerNamespace is where the dev controller keeps its CA Secret
// and looks for the default TerraceConfig.
const devControllerNamespace = "terrace-system"

// runDevController runs the Terrace controller in this process against the
// dev cluster until ctx ends. Its artifact and state servers listen on the
// host's end of the node's link, where runner pods reach them.
func runDevController(ctx context.Context, cfg *rest.Config, log logr.Logger, hostIP string, providerMirror bool) error {
	ctrl.SetLogger(log.WithName("controller"))
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create clientset: %w", err)
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: devControllerNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("failed to create namespace %s: %w", devControllerNamespace, err)
	}
	ports, err := devcluster.FreePorts(hostIP, 2)
	if err != nil {
		return err
	}
	opts := operator.LocalOptions(devControllerNamespace, net.JoinHostPort(hostIP, fmt.Sprint(ports[0])), net.JoinHostPort(hostIP, fmt.Sprint(ports[1])))
	if providerMirror {
		opts.RunnerProviderMirror = image.ProviderMirrorDir
	}
	log.Info("starting the Terrace controller", "namespace", opts.Namespace, "artifactServer", opts.Artifact.BaseURL, "stateServer", opts.State.AdvertisedURL)
	return operator.Run(ctx, cfg, opts)
}
