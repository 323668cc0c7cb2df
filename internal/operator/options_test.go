package operator

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
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

// --watch-namespaces restricts the controller to the listed namespaces and
// its own; a system namespace, in the list or as the operator's, and a
// name no namespace can have stop it at its start with the reason.
func TestWatchNamespacesFlag(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		want      []string
		wantError string
	}{
		{name: "unset watches every namespace", args: nil, want: nil},
		{name: "empty watches every namespace", args: []string{"--watch-namespaces="}, want: nil},
		{name: "the operator namespace is always added", args: []string{"--watch-namespaces=team-b,team-a"}, want: []string{"team-a", "team-b", "terrace-system"}},
		{name: "repeats are one", args: []string{"--watch-namespaces=team-a,terrace-system", "--watch-namespaces=team-a"}, want: []string{"team-a", "terrace-system"}},
		{name: "kube-system", args: []string{"--watch-namespaces=team-a,kube-system"}, wantError: "kube-system is a system namespace"},
		{name: "kube-public", args: []string{"--watch-namespaces=kube-public"}, wantError: "kube-public is a system namespace"},
		{name: "kube-node-lease", args: []string{"--watch-namespaces=kube-node-lease"}, wantError: "kube-node-lease is a system namespace"},
		{name: "operator in kube-system", args: []string{"--namespace=kube-system", "--watch-namespaces=team-a"}, wantError: "the operator runs in kube-system"},
		{name: "operator in kube-system, every namespace", args: []string{"--namespace=kube-system"}, want: nil},
		{name: "an empty name", args: []string{"--watch-namespaces=team-a,,team-b"}, wantError: "an empty name"},
		{name: "not a name", args: []string{"--watch-namespaces=Team_A"}, wantError: `"Team_A" is not a namespace name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", "terrace-system")
			o := DefaultOptions()
			fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
			o.BindFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := o.WatchedNamespaces()
			switch {
			case tc.wantError != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantError)
				}
			case err != nil:
				t.Fatal(err)
			case !slices.Equal(got, tc.want):
				t.Errorf("watched %v, want %v", got, tc.want)
			}
		})
	}
}

// The refusal comes before anything is done on the cluster: NewManager
// returns it without an API server to talk to.
func TestNewManagerRefusesASystemNamespaceFirst(t *testing.T) {
	o := LocalOptions("terrace-system", "127.0.0.1:0", "127.0.0.1:0")
	o.WatchNamespaces = []string{"team-a", "kube-system"}
	_, err := NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, o)
	if err == nil || !strings.Contains(err.Error(), "kube-system is a system namespace") {
		t.Fatalf("NewManager: %v, want the system namespace refused", err)
	}
}
