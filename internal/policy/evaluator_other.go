//go:build !linux

package policy

import (
	"errors"
	"os"
	"syscall"
)

func evaluatorProcAttr() *syscall.SysProcAttr { return nil }

// limitMemory: the controller runs on Linux; elsewhere no evaluation runs
// without its memory bound.
func limitMemory(int64) error {
	return errors.New("plan policies are evaluated with a memory bound only on Linux")
}

func peakRSS(*os.ProcessState) int64 { return 0 }
