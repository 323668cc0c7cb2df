package operator

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// A run's timeout is bounded by default (2h), and one namespace's share of
// the run slots is derived from --max-concurrent-runs unless set; the
// flags reach the Stack controller's options.
func TestRunLimitFlags(t *testing.T) {
	o := DefaultOptions()
	if o.MaxRunTimeout != 2*time.Hour || o.MaxRunsPerNamespace != 0 || o.MaxConcurrentRuns != 4 {
		t.Fatalf("defaults: --max-run-timeout %v, --max-runs-per-namespace %d, --max-concurrent-runs %d; want 2h, 0 (one less than the runs), 4",
			o.MaxRunTimeout, o.MaxRunsPerNamespace, o.MaxConcurrentRuns)
	}
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"--max-run-timeout=45m", "--max-runs-per-namespace=2", "--max-concurrent-runs=6"}); err != nil {
		t.Fatal(err)
	}
	if o.MaxRunTimeout != 45*time.Minute || o.MaxRunsPerNamespace != 2 || o.MaxConcurrentRuns != 6 {
		t.Errorf("parsed: %v, %d, %d; want 45m, 2, 6", o.MaxRunTimeout, o.MaxRunsPerNamespace, o.MaxConcurrentRuns)
	}
}
