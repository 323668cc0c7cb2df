// Command coredns is CoreDNS v1.15.0 with only the plugins the dev
// cluster's Corefile uses (internal/devcluster/addons.go): cluster DNS from
// the Kubernetes API, a cache, health and readiness endpoints, the error log
// and loop detection. The full plugin set pulls in every cloud's SDK and
// triples the cold build; a custom build is how CoreDNS documents adding or
// leaving out plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order in which the plugins see a query: CoreDNS's plugin.cfg order.
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "cache", "kubernetes", "loop"}
}

func main() {
	coremain.Run()
}
