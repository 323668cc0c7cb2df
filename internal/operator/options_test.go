package operator

import (
	"slices"
	"testing"
	"time"

	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
)

// The serving certificate must name the Service in the namespace given by
// --namespace, whatever POD_NAMESPACE said when the defaults were made.
func TestServingDNSNamesFollowTheNamespaceFlag(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	o := DefaultOptions()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"--namespace", "platform"}); err != nil {
		t.Fatal(err)
	}
	if names := o.ServingDNSNames(); !slices.Contains(names, "terrace-controller.platform.svc") {
		t.Errorf("serving names %v do not name the Service in platform", names)
	}
	if err := fs.Parse([]string{"--server-dns-names", "terrace.example.com"}); err != nil {
		t.Fatal(err)
	}
	if names := o.ServingDNSNames(); !slices.Equal(names, []string{"terrace.example.com"}) {
		t.Errorf("explicit names replaced: %v", names)
	}
}

// Flux artifacts come from source-controller's Service unless the operator
// lists other hosts; the flag replaces the default list.
func TestSourceArtifactHostsFlag(t *testing.T) {
	o := DefaultOptions()
	if !slices.Contains(o.SourceArtifactHosts, "source-controller.flux-system.svc.cluster.local") {
		t.Fatalf("default hosts %v do not name source-controller", o.SourceArtifactHosts)
	}
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"--source-artifact-hosts", "source-controller.flux.svc:9090,artifacts.internal"}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"source-controller.flux.svc:9090", "artifacts.internal"}; !slices.Equal(o.SourceArtifactHosts, want) {
		t.Errorf("hosts %v, want %v", o.SourceArtifactHosts, want)
	}
}

// The lease's timing flags reach the manager's options; unset, they leave
// controller-runtime's defaults.
func TestLeaderElectionTimingFlags(t *testing.T) {
	o := DefaultOptions()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	o.BindFlags(fs)
	var unset ctrl.Options
	o.LeaderElectionTiming.apply(&unset)
	if unset.LeaseDuration != nil || unset.RenewDeadline != nil || unset.RetryPeriod != nil {
		t.Fatalf("no flags set the lease timing: %v %v %v", unset.LeaseDuration, unset.RenewDeadline, unset.RetryPeriod)
	}
	if err := fs.Parse([]string{"--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s"}); err != nil {
		t.Fatal(err)
	}
	var set ctrl.Options
	o.LeaderElectionTiming.apply(&set)
	if set.LeaseDuration == nil || *set.LeaseDuration != 6*time.Second || set.RenewDeadline == nil || *set.RenewDeadline != 4*time.Second || set.RetryPeriod == nil || *set.RetryPeriod != time.Second {
		t.Fatalf("lease timing %v %v %v, want 6s 4s 1s", set.LeaseDuration, set.RenewDeadline, set.RetryPeriod)
	}
}
