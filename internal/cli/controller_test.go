package cli

import (
	"testing"

	"k8s.io/client-go/rest"
)

// Without limits of its own the controller's client runs at client-go's
// 5 requests a second: the fault harness (test/chaos) saw it throttled
// for a second and more with a dozen Stacks.
func TestControllerClientIsNotThrottledAtClientGoDefaults(t *testing.T) {
	cmd := newControllerCommand()
	for flag, want := range map[string]string{"kube-api-qps": "50", "kube-api-burst": "300"} {
		f := cmd.Flags().Lookup(flag)
		if f == nil || f.DefValue != want {
			t.Fatalf("--%s = %v, want default %s", flag, f, want)
		}
	}
	if err := cmd.Flags().Parse([]string{"--kube-api-qps=70", "--kube-api-burst=140"}); err != nil {
		t.Fatal(err)
	}
	qps, _ := cmd.Flags().GetFloat32("kube-api-qps")
	burst, _ := cmd.Flags().GetInt("kube-api-burst")
	cfg := &rest.Config{}
	kubeAPIOptions{QPS: qps, Burst: burst}.apply(cfg)
	if cfg.QPS != 70 || cfg.Burst != 140 {
		t.Errorf("rest config QPS %v burst %d, want 70 and 140 from the flags", cfg.QPS, cfg.Burst)
	}
}
