package policy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// evaluatorProcAttr has the kernel kill the evaluator if the controller
// dies first.
func evaluatorProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// limitMemory caps this process's data segment at what it maps now plus
// limit. RLIMIT_DATA counts private writable mappings, which is where the
// Go heap lives (it maps arenas writable as it grows); it leaves out the
// address space the runtime only reserves, which RLIMIT_AS would count at
// the arena's coarse granularity. A mapping past the cap fails with ENOMEM
// and the runtime ends the process: "fatal error: runtime: out of memory".
// RLIMIT_CPU backs the parent's deadline.
func limitMemory(limit int64) error {
	data, err := vmData()
	if err != nil {
		return err
	}
	capBytes := uint64(data + limit)
	if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: capBytes, Max: capBytes}); err != nil {
		return fmt.Errorf("failed to limit the evaluator's memory: %w", err)
	}
	cpu := uint64((EvalTimeout + killGrace).Seconds()) + 1
	if err := syscall.Setrlimit(syscall.RLIMIT_CPU, &syscall.Rlimit{Cur: cpu, Max: cpu}); err != nil {
		return fmt.Errorf("failed to limit the evaluator's CPU time: %w", err)
	}
	return nil
}

// vmData is this process's data segment now, in bytes.
func vmData() (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("failed to read the evaluator's memory use: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) == 3 && string(fields[0]) == "VmData:" && string(fields[2]) == "kB" {
			kb, err := strconv.ParseInt(string(fields[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("failed to read VmData: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmData in /proc/self/status")
}

// peakRSS is a finished process's largest resident set in bytes.
func peakRSS(ps *os.ProcessState) int64 {
	if ps == nil {
		return 0
	}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss << 10
	}
	return 0
}
