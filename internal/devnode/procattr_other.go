//go:build !linux

package devnode

import "syscall"

// childProcAttr puts a pod process in its own process group. Outside Linux
// there is no Pdeathsig: a killed devnode leaves its pods running.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
