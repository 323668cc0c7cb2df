package devnode

import "syscall"

// childProcAttr puts a pod process in its own process group (so every
// process it forks, such as tofu, is signalled with it) and has the kernel
// kill it if devnode dies.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
