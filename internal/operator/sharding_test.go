package operator

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// A shard reconciles what its selector matches, under a lease of its own;
// an unsharded controller keeps the lease and the runner pod labels it
// always had; a selector that does not parse stops the controller.
func TestWatchLabelSelectorFlag(t *testing.T) {
	parse := func(args ...string) (shard, error) {
		o := DefaultOptions()
		fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
		o.BindFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o.shard()
	}
	unsharded, err := parse()
	if err != nil || unsharded.sharded() || unsharded.id != "" || unsharded.leaseName != "terrace-controller-leader" {
		t.Fatalf("no selector: %+v, %v; want every object, no shard ID, the usual lease", unsharded, err)
	}
	if !unsharded.matches(map[string]string{ShardingKey: "shard1"}) {
		t.Error("an unsharded controller must reconcile labelled objects too")
	}
	main, err := parse("--watch-label-selector", "!"+ShardingKey)
	if err != nil {
		t.Fatal(err)
	}
	shard1, err := parse("--watch-label-selector", ShardingKey+"=shard1")
	if err != nil {
		t.Fatal(err)
	}
	if !main.matches(nil) || main.matches(map[string]string{ShardingKey: "shard1"}) {
		t.Error("the main shard must take unlabelled objects and only them")
	}
	if shard1.matches(nil) || !shard1.matches(map[string]string{ShardingKey: "shard1"}) || shard1.matches(map[string]string{ShardingKey: "shard2"}) {
		t.Error("shard1 must take shard1's objects only")
	}
	for _, s := range []shard{main, shard1} {
		if s.id == "" || len(s.id) > 63 || !strings.HasPrefix(s.leaseName, "terrace-controller-leader-") {
			t.Errorf("shard %s: id %q, lease %q: want a label-safe ID and a lease of its own", s, s.id, s.leaseName)
		}
	}
	if main.id == shard1.id || main.leaseName == shard1.leaseName {
		t.Errorf("two shards share an ID or a lease: %q %q, %q %q", main.id, shard1.id, main.leaseName, shard1.leaseName)
	}
	if _, err := parse("--watch-label-selector", "a in (b"); err == nil || !strings.Contains(err.Error(), "--watch-label-selector") {
		t.Errorf("a bad selector: %v, want an error naming the flag", err)
	}
}

// A shard's runners are told to reach the side servers at its own
// Service, which its serving certificate names.
func TestServiceNameFlag(t *testing.T) {
	o := DefaultOptions()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"--namespace", "terrace-system", "--service-name", "terrace-controller-shard1"}); err != nil {
		t.Fatal(err)
	}
	state, err := o.stateServerURL()
	if err != nil || state != "https://terrace-controller-shard1.terrace-system.svc:9444" {
		t.Errorf("state server URL %q, %v", state, err)
	}
	artifacts, err := o.artifactServerURL()
	if err != nil || artifacts != "https://terrace-controller-shard1.terrace-system.svc:9443" {
		t.Errorf("artifact server URL %q, %v", artifacts, err)
	}
	if names := o.ServingDNSNames(); !strings.Contains(strings.Join(names, ","), "terrace-controller-shard1.terrace-system.svc") {
		t.Errorf("serving names %v do not name the shard's Service", names)
	}
}
