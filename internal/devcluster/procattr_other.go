//go:build !linux

package devcluster

import "syscall"

// childProcAttr puts a child in its own process group. Without Pdeathsig
// outside Linux, a killed parent leaves its children to Stop's callers.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
