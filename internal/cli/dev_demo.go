package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/terrace-dev/terrace/internal/devcluster"
)

func runDemo(ctx context.Context, out io.Writer, dev *devcluster.Dev, examples string, timeout time.Duration, controllerDone chan error) error {
	objs, err := devcluster.ReadManifestFiles(examples)
	if err != nil {
		return err
	}
	if len(objs) == 0 {
		return fmt.Errorf("no manifests in %s", examples)
	}
	progress := func(line string) { fmt.Fprintln(out, "demo:", line) }
	if err := devcluster.Apply(ctx, dev.Cluster.Config, objs, progress); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		// A controller that dies ends the wait early: nothing will change.
		// Its result goes back for runDev, which waits for it on the way out.
		select {
		case err := <-controllerDone:
			controllerDone <- err
			if err != nil {
				progress("controller stopped: " + err.Error())
			}
			cancel()
		case <-waitCtx.Done():
		}
	}()
	outcomes, waitErr := devcluster.WaitAll(waitCtx, dev.Cluster.Config, objs, progress)
	fmt.Fprintln(out, "\nresults:")
	if err := devcluster.Report(ctx, dev.Cluster.Config, outcomes, out); err != nil {
		return err
	}
	ready, failed := 0, 0
	for _, o := range outcomes {
		switch o.Health {
		case devcluster.Current:
			ready++
		case devcluster.Failed:
			failed++
		}
	}
	fmt.Fprintf(out, "\ndemo: %d of %d objects Ready, %d failed\n", ready, len(outcomes), failed)
	if waitErr != nil || ready != len(outcomes) {
		return fmt.Errorf("the demo did not fully work: %d of %d objects Ready", ready, len(outcomes))
	}
	return nil
}
