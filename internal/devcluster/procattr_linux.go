package devcluster

import "syscall"

// childProcAttr puts a child in its own process group (so stop can signal
// everything it forked) and has the kernel kill it if this process dies.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
