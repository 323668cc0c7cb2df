package cli

import "testing"

// TestListenAddress: $(POD_IP):8443 works for IPv4 and IPv6 pods alike.
func TestListenAddress(t *testing.T) {
	for in, want := range map[string]string{
		":8443":          ":8443",
		"127.0.0.7:8443": "127.0.0.7:8443",
		"[fd00::5]:8443": "[fd00::5]:8443",
		"fd00::5:8443":   "[fd00::5]:8443",
		"localhost:8443": "localhost:8443",
		"not an address": "not an address",
		"fd00::zz:8443":  "fd00::zz:8443",
	} {
		if got := listenAddress(in); got != want {
			t.Errorf("listenAddress(%q) = %q, want %q", in, got, want)
		}
	}
}
