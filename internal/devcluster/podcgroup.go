package devcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The cgroups of one pod, for the benchmark's accounting: what the
// controller's pod costs in CPU and memory, read where the kubelet keeps
// them (cgroup v1, the cgroupfs driver: <cgroupRoot>/kubepods[/<qos>]/pod<uid>).

// podCgroup is the pod's directory in hierarchy (cpuacct, memory).
func (n *Node) podCgroup(hierarchy, uid string) (string, error) {
	root := filepath.Join(cgroupFS, hierarchy, n.sandbox.cgroupRoot(), "kubepods")
	for _, pattern := range []string{"pod" + uid, "*/pod" + uid} {
		if found, _ := filepath.Glob(filepath.Join(root, pattern)); len(found) == 1 {
			return found[0], nil
		}
	}
	return "", fmt.Errorf("no %s cgroup of pod %s under %s", hierarchy, uid, root)
}

func readCounter(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
}

// PodCPU is the CPU time the pod with uid has used so far.
func (n *Node) PodCPU(uid string) (time.Duration, error) {
	dir, err := n.podCgroup("cpuacct", uid)
	if err != nil {
		return 0, err
	}
	ns, err := readCounter(filepath.Join(dir, "cpuacct.usage"))
	return time.Duration(ns), err
}

// PodMemoryPeak is the most memory the pod with uid has been charged
// since it started or since ResetPodMemoryPeak, page cache included, as
// the kernel counts it against the pod's memory limit.
func (n *Node) PodMemoryPeak(uid string) (uint64, error) {
	dir, err := n.podCgroup("memory", uid)
	if err != nil {
		return 0, err
	}
	v, err := readCounter(filepath.Join(dir, "memory.max_usage_in_bytes"))
	return uint64(v), err
}

// ResetPodMemoryPeak starts PodMemoryPeak again from the pod's usage now.
func (n *Node) ResetPodMemoryPeak(uid string) error {
	dir, err := n.podCgroup("memory", uid)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "memory.max_usage_in_bytes"), []byte("0"), 0)
}
