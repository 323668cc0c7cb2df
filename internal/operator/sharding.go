package operator

// Sharding: several controller Deployments, each with its own
// --watch-label-selector, as Flux's controllers shard (docs/sharding.md).
//
// What a shard owns, by its selector: the Stacks it caches and reconciles
// (its cache holds no other Stack), the Programs and TerraceConfigs it
// reconciles (a predicate: every shard still caches and reads them all,
// since a Stack of any shard may name any Program of its namespace and is
// governed by its namespace's config), the notifications of its Stacks,
// its warm runner pods (labelled with its shard ID) and its leader lease.
// What every shard shares: the CA Secret (rotation is a compare-and-swap),
// the runner pods' metadata (a state migration counts every run of a
// namespace), and its artifact and state servers answer a run of any shard
// (a Stack moved mid-run keeps its runner talking to the old shard's
// Service, which then reads the Stack from the API server).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	fluxcontroller "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/leaderelection"
	"k8s.io/apimachinery/pkg/labels"
)

// ShardingKey is Flux's label for the shard an object belongs to; the
// chart's shards select on it.
const ShardingKey = "sharding.fluxcd.io/key"

// leaderElectionID is the lease of an unsharded controller.
const leaderElectionID = "terrace-controller-leader"

// shard is what --watch-label-selector makes of the controller.
type shard struct {
	// selector matches the objects the controller reconciles; nil when it
	// is not sharded (every object).
	selector labels.Selector
	// id names the shard on what it creates and must tell apart from
	// other shards' (warm runner pods, runner pods): a short hash of the
	// selector, empty when not sharded, so that an unsharded controller's
	// pods keep the labels they always had.
	id string
	// leaseName is the leader lease: one per shard, since each shard is a
	// Deployment of its own whose replicas elect their own leader.
	leaseName string
}

// shard parses --watch-label-selector with Flux's helper.
func (o Options) shard() (shard, error) {
	if o.WatchLabelSelector == "" {
		return shard{leaseName: leaderElectionID}, nil
	}
	sel, err := fluxcontroller.GetWatchSelector(fluxcontroller.WatchOptions{LabelSelector: o.WatchLabelSelector})
	if err != nil {
		return shard{}, fmt.Errorf("--watch-label-selector %q: %w", o.WatchLabelSelector, err)
	}
	if sel.Empty() {
		return shard{leaseName: leaderElectionID}, nil
	}
	sum := sha256.Sum256([]byte(sel.String()))
	return shard{
		selector:  sel,
		id:        hex.EncodeToString(sum[:5]),
		leaseName: leaderelection.GenerateID(leaderElectionID, sel.String()),
	}, nil
}

// sharded says the controller reconciles only some objects.
func (s shard) sharded() bool { return s.selector != nil }

// matches says the controller reconciles an object with these labels.
func (s shard) matches(l map[string]string) bool {
	return s.selector == nil || s.selector.Matches(labels.Set(l))
}

// String is the selector, for logs.
func (s shard) String() string {
	if s.selector == nil {
		return ""
	}
	return s.selector.String()
}

// ShardID is the ID a controller run with --watch-label-selector=selector
// puts on the runner pods it starts (launcher.LabelShard); empty when the
// selector selects everything.
func ShardID(selector string) (string, error) {
	s, err := Options{WatchLabelSelector: selector}.shard()
	return s.id, err
}
