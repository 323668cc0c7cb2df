package tf

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// cgroupRoot is where a container sees its own cgroup (runc mounts it
// there, v1 and v2 alike).
const cgroupRoot = "/sys/fs/cgroup"

// oomExplanation says why a tofu command that ended by SIGKILL died when
// the kernel's out-of-memory killer did it: the container's cgroup counts
// OOM kills. Empty when the command was not killed or not by the OOM
// killer. Without it the user reads only "signal: killed".
func oomExplanation(err error, root string) string {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		if !strings.Contains(err.Error(), "signal: killed") {
			return ""
		}
	} else if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return ""
	}
	kills, limit := cgroupOOM(root)
	if kills == 0 {
		return ""
	}
	what := "the runner container's memory limit"
	if limit != "" {
		what += " (" + limit + ")"
	}
	return fmt.Sprintf("killed by the kernel's out-of-memory killer: %s is too low for this run; raise spec.runner.resources.limits.memory (or the TerraceConfig's runner resources)", what)
}

// cgroupOOM reads the OOM kills counted in the cgroup at root and its
// memory limit, from cgroup v2 (memory.events, memory.max) or v1
// (memory/memory.oom_control, memory/memory.limit_in_bytes).
func cgroupOOM(root string) (kills int, limit string) {
	for _, layout := range []struct{ events, max string }{
		{filepath.Join(root, "memory.events"), filepath.Join(root, "memory.max")},
		{filepath.Join(root, "memory", "memory.oom_control"), filepath.Join(root, "memory", "memory.limit_in_bytes")},
	} {
		data, err := os.ReadFile(layout.events)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				kills, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		if raw, err := os.ReadFile(layout.max); err == nil {
			limit = humanBytes(strings.TrimSpace(string(raw)))
		}
		return kills, limit
	}
	return 0, ""
}

// humanBytes writes a cgroup limit in MiB; "" when there is none.
func humanBytes(raw string) string {
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n <= 0 || n >= 1<<60 {
		return "" // "max", or v1's "no limit" (a page-aligned near-MaxInt64)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
