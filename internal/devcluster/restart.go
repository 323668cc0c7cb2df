package devcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Restart stops one control-plane process ("etcd", "kube-apiserver" or
// "kube-controller-manager") and starts it again with the same arguments,
// ports and data, as a supervisor restarts a crashed or upgraded component.
// With kill the process gets SIGKILL at once (a crash), else SIGTERM and the
// usual grace period. It returns once the component serves again. The
// fault tests (test/chaos) use it.
func (c *Cluster) Restart(ctx context.Context, component string, kill bool) error {
	idx := -1
	for i, p := range c.procs {
		if p.name == component {
			idx = i
		}
	}
	if idx < 0 {
		return fmt.Errorf("no %s process in this cluster", component)
	}
	old := c.procs[idx]
	grace := stopGrace
	if kill {
		grace = 0
	}
	old.stop(grace)
	p, err := startProcess(old.name, old.cmd.Path, old.cmd.Args[1:], old.logPath)
	if err != nil {
		return err
	}
	c.procs[idx] = p
	c.log.V(1).Info("restarted", "process", component, "pid", p.Pid())
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	switch component {
	case "etcd":
		url := flagValue(old.cmd.Args, "--listen-client-urls")
		return waitReady(ctx, p, plainGetter(url+"/health"))
	case "kube-apiserver":
		adminHTTP, err := rest.HTTPClientFor(c.Config)
		if err != nil {
			return fmt.Errorf("failed to build admin HTTP client: %w", err)
		}
		return waitReady(ctx, p, clientGetter(adminHTTP, c.APIServerURL+"/readyz"))
	default:
		return nil
	}
}

// flagValue returns the value of --name=value in args, or "".
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}
