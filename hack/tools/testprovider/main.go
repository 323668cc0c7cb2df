// Command terraform-provider-testfile is a tiny OpenTofu provider for
// Terrace's drift tests: its one resource, testfile_file, manages a file on
// the local disk, so a test can make drift by editing the file by hand.
//
// It is built by `make tools` (hack/tools/build.sh) into a CLI-config
// filesystem_mirror and is never imported by the main module.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"
)

// providerAddress is the source address the mirror layout and the tests use.
const providerAddress = "registry.opentofu.org/terrace-dev/testfile"

// version is the provider version; build.sh lays the binary out under it.
const version = "0.1.0"

func main() {
	var debug bool
	flag.BoolVar(&debug, "debug", false, "start the provider in debug mode for a debugger to attach")
	flag.Parse()

	err := providerserver.Serve(context.Background(), newProvider(version), providerserver.ServeOpts{
		Address: providerAddress,
		Debug:   debug,
	})
	if err != nil {
		log.Fatalf("failed to serve provider: %v", err)
	}
}
