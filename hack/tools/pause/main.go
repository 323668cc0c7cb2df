// Command pause holds a pod sandbox's namespaces for the dev cluster's node,
// as registry.k8s.io/pause does: it sleeps until SIGINT or SIGTERM and, being
// the sandbox's PID 1 when the pod shares its process namespace, reaps the
// children that are re-parented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
