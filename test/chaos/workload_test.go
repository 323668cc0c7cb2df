package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// chaosModule manages `files` files of the test provider under dir, each
// holding "generation N", then waits `sleep` (2) seconds in a provisioner
// (the window for faults mid-apply) on every new generation. The image has
// no shell, so the provisioner runs the image's terrace (dev pod-fixture
// --hold) instead of sleep. pad puts that many
// bytes into the state (twice: input and output), for the upload and
// oversize faults.
const chaosModule = `
terraform {
  required_providers {
    testfile = {
      source  = "terrace-dev/testfile"
      version = "0.1.0"
    }
  }
}
variable "dir" { type = string }
variable "generation" { type = number }
variable "files" {
  type    = number
  default = 2
}
variable "sleep" {
  type    = number
  default = 2
}
variable "pad" {
  type    = number
  default = 0
}
resource "testfile_file" "f" {
  count   = var.files
  path    = "${var.dir}/file-${count.index}.txt"
  content = "generation ${var.generation}"
}
resource "terraform_data" "slow" {
  depends_on       = [testfile_file.f]
  triggers_replace = var.generation
  input            = var.pad > 0 ? format("%0${var.pad}d", 0) : ""
  provisioner "local-exec" {
    interpreter = ["/usr/local/bin/terrace", "dev", "pod-fixture", "--hold"]
    command     = "${var.sleep}s"
  }
}
output "files" { value = length(testfile_file.f) }
`

// workload is one Stack of chaosModule and what the harness saw of it.
type workload struct {
	e     *env
	ns    string
	name  string
	dir   string
	files int
	pad   int
	sleep int
	// postgres is set when the namespace keeps state in PostgreSQL.
	postgres bool

	mu sync.Mutex
	// generation is the value of var.generation the Stack asks for now.
	generation int
	// serials are the state serials seen, in order, with their lineages.
	serials  []int64
	lineages []string
	// stateErrors are anomalies seen while watching the state.
	stateErrors []string
	stop        context.CancelFunc
	done        chan struct{}
	// fresh is set when the fault is to hit the run that creates the Stack.
	fresh bool
	// lastRunner and lastListed spare the triggers most pod listings.
	lastRunner *runner
	lastListed time.Time
}

// workloadSpec says what a workload's Stack is.
type workloadSpec struct {
	name  string
	files int
	pad   int
	// postgres keeps the namespace's state in PostgreSQL.
	postgres bool
	// awaitApproval leaves spec.approvePlan empty (plans wait for an id),
	// instead of auto.
	awaitApproval bool
	// sleep is the provisioner's sleep in seconds: the mid-apply window
	// (0: the module's 2).
	sleep int
}

// newWorkload creates a namespace, the Program and the Stack at generation
// 1 (not waiting for it) and starts watching its state.
func (e *env) newWorkload(ctx context.Context, spec workloadSpec) (*workload, error) {
	name, pg := spec.name, spec.postgres
	ns, err := e.namespace(ctx, name)
	if err != nil {
		return nil, err
	}
	w := &workload{e: e, ns: ns, name: name, dir: filepath.Join(e.dir, "files", ns), files: spec.files, pad: spec.pad, sleep: spec.sleep, postgres: pg, generation: 1}
	if err := e.filesVolume(ctx, ns, w.dir); err != nil {
		return nil, err
	}
	approvePlan := terracev1.ApprovePlanAuto
	if spec.awaitApproval {
		approvePlan = ""
	}
	if pg {
		if err := e.createKeep(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: ns}, StringData: map[string]string{"url": e.pgURL}}); err != nil {
			return nil, err
		}
		cfg := &terracev1.TerraceConfig{
			ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName, Namespace: ns},
			Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Backend:  terracev1.StateBackendPostgres,
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
			}},
		}
		if err := e.createKeep(ctx, cfg); err != nil {
			return nil, err
		}
	}
	program := &terracev1.Program{
		ObjectMeta: metav1.ObjectMeta{Name: "chaos", Namespace: ns},
		Spec:       terracev1.ProgramSpec{Files: map[string]terracev1.ProgramFile{"main.tf": chaosModule}},
	}
	if err := e.createKeep(ctx, program); err != nil {
		return nil, err
	}
	stack := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: terracev1.StackSpec{
			Source:          terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "chaos"}},
			Vars:            w.vars(),
			ApprovePlan:     approvePlan,
			RetryInterval:   &metav1.Duration{Duration: 2 * time.Second},
			DriftDetection:  &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
			DestroyOnDelete: true,
			// The test provider's files are on the host, where the
			// harness reads them: the runner mounts them by claim at
			// the same path.
			Runner: &terracev1.RunnerPodTemplate{
				Volumes: []corev1.Volume{{Name: filesClaim, VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: filesClaim},
				}}},
				VolumeMounts: []corev1.VolumeMount{{Name: filesClaim, MountPath: w.dir}},
			},
		},
	}
	if err := e.createKeep(ctx, stack); err != nil {
		return nil, err
	}
	watchCtx, stop := context.WithCancel(context.Background())
	w.stop, w.done = stop, make(chan struct{})
	go w.watchState(watchCtx)
	return w, nil
}

func (w *workload) vars() map[string]apiextensionsv1.JSON {
	j := func(v any) apiextensionsv1.JSON {
		switch v := v.(type) {
		case string:
			return apiextensionsv1.JSON{Raw: []byte(strconv.Quote(v))}
		default:
			return apiextensionsv1.JSON{Raw: []byte(fmt.Sprint(v))}
		}
	}
	vars := map[string]apiextensionsv1.JSON{
		"dir": j(w.dir), "generation": j(w.generation), "files": j(w.files), "pad": j(w.pad),
	}
	if w.sleep > 0 {
		vars["sleep"] = j(w.sleep)
	}
	return vars
}

// currentGeneration is the generation of var.generation asked for now.
func (w *workload) currentGeneration() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.generation
}

// bump asks for the next generation: one more run.
func (w *workload) bump(ctx context.Context) error {
	w.mu.Lock()
	w.generation++
	w.mu.Unlock()
	return w.update(ctx, func(s *terracev1.Stack) { s.Spec.Vars = w.vars() })
}

// setDriftChecks turns drift detection on (every interval) or off.
func (w *workload) setDriftChecks(ctx context.Context, mode terracev1.DriftDetectionMode, interval time.Duration) error {
	return w.update(ctx, func(s *terracev1.Stack) {
		s.Spec.DriftDetection = &terracev1.DriftDetection{Mode: mode}
		s.Spec.Interval = nil
		if interval > 0 {
			s.Spec.Interval = &metav1.Duration{Duration: interval}
		}
	})
}

func (w *workload) update(ctx context.Context, change func(*terracev1.Stack)) error {
	return poll(ctx, time.Minute, func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		change(s)
		return w.e.c.Update(ctx, s)
	})
}

func (w *workload) get(ctx context.Context) (*terracev1.Stack, error) {
	var s terracev1.Stack
	err := w.e.c.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: w.name}, &s)
	return &s, err
}

// readyAt accepts a Stack that is Ready at its current generation.
func readyAt(s *terracev1.Stack) error {
	for _, c := range s.Status.Conditions {
		if c.Type == terracev1.ReadyCondition && c.Status == metav1.ConditionTrue && c.ObservedGeneration == s.Generation && s.Status.ObservedGeneration == s.Generation {
			return nil
		}
	}
	return fmt.Errorf("not Ready at generation %d: %s", s.Generation, conditionsText(s))
}

func conditionsText(s *terracev1.Stack) string {
	var parts []string
	for _, c := range s.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

// waitReady waits until the Stack is Ready at its current generation.
func (w *workload) waitReady(ctx context.Context, timeout time.Duration) error {
	return poll(ctx, timeout, func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		return readyAt(s)
	})
}

// store is the state store the namespace uses.
func (w *workload) store(ctx context.Context) (state.Store, release.Store, func(), error) {
	if w.postgres {
		db, err := postgres.Open(ctx, w.e.pgURL, postgres.Options{})
		if err != nil {
			return nil, nil, nil, err
		}
		return db, db, db.Close, nil
	}
	store := secrets.New(w.e.c, secrets.Options{})
	return store, store, func() {}, nil
}

func (w *workload) key() state.Key {
	return state.Key{Namespace: w.ns, Stack: w.name, Workspace: "default"}
}

// watchState records every state serial and lineage it sees, twice a
// second, until stopWatching.
func (w *workload) watchState(ctx context.Context) {
	defer close(w.done)
	for ctx.Err() == nil {
		w.observeState(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (w *workload) observeState(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	store, _, closeStore, err := w.store(ctx)
	if err != nil {
		return // PostgreSQL or the API server restarting
	}
	defer closeStore()
	// The index's record of the current version, not the state itself:
	// its serial and lineage are what the write recorded, and reading a
	// megabyte of state twice a second per Stack takes the CPU the runs
	// need. The end check reads the state.
	versions, err := store.ListVersions(ctx, w.key())
	if err != nil || len(versions) == 0 {
		return
	}
	st := versions[0]
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.serials); n > 0 {
		last := w.serials[n-1]
		if st.Serial < last {
			w.stateErrors = append(w.stateErrors, fmt.Sprintf("serial went back from %d to %d", last, st.Serial))
		}
		if st.Lineage != w.lineages[n-1] {
			w.stateErrors = append(w.stateErrors, fmt.Sprintf("lineage changed from %s to %s", w.lineages[n-1], st.Lineage))
		}
		if st.Serial == last && st.Lineage == w.lineages[n-1] {
			return
		}
	}
	w.serials = append(w.serials, st.Serial)
	w.lineages = append(w.lineages, st.Lineage)
}

func (w *workload) stopWatching() {
	if w.stop != nil {
		w.stop()
		<-w.done
		w.stop = nil
	}
}

// runnerPods lists the Stack's runner pods.
func (w *workload) runnerPods(ctx context.Context) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := w.e.c.List(ctx, &pods, client.InNamespace(w.ns), client.MatchingLabels{
		launcher.LabelStack: launcher.StackLabelValue(w.name), launcher.LabelComponent: launcher.ComponentRunner,
	})
	return pods.Items, err
}

// runner is a runner process and what tofu is doing under it.
type runner struct {
	pod string
	uid string
	// container is the runner container's containerd id; pid the host PID
	// of its first process, the runner.
	container string
	pid       int
	// tofu is tofu's subcommand (plan, apply, init, show, output...), or "".
	tofu string
	// sleeping is true while the module's provisioner runs.
	sleeping bool
}

// runner finds the process of the Stack's running runner pod. The triggers
// call it every few milliseconds: the pod's process is remembered, and the
// pods are listed at most five times a second.
func (w *workload) runner(ctx context.Context) (*runner, error) {
	w.mu.Lock()
	cached := w.lastRunner
	w.mu.Unlock()
	if cached == nil || !inContainer(cached.pid, cached.container) {
		w.mu.Lock()
		recent := time.Since(w.lastListed) < 200*time.Millisecond
		w.mu.Unlock()
		if recent {
			return nil, errors.New("no runner process")
		}
		found, err := w.findRunner(ctx)
		w.mu.Lock()
		w.lastListed, w.lastRunner = time.Now(), found
		w.mu.Unlock()
		if err != nil {
			return nil, err
		}
		cached = found
	}
	r := &runner{pod: cached.pod, uid: cached.uid, container: cached.container, pid: cached.pid}
	for _, child := range children(r.pid) {
		args := cmdline(child)
		if len(args) == 0 {
			continue
		}
		switch base := filepath.Base(args[0]); {
		case base == "tofu":
			for _, a := range args[1:] {
				if !strings.HasPrefix(a, "-") {
					r.tofu = a
					break
				}
			}
		case base == "terrace" && slices.Contains(args, "--hold"):
			r.sleeping = true
		}
	}
	return r, nil
}

// findRunner finds the running runner container of the Stack's pods and
// its process on the node (the host's PID: the node's processes are this
// machine's).
func (w *workload) findRunner(ctx context.Context) (*runner, error) {
	pods, err := w.runnerPods(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Running == nil || c.ContainerID == "" {
				continue
			}
			id := strings.TrimPrefix(c.ContainerID, "containerd://")
			if pid, err := containerPid(id); err == nil {
				return &runner{pod: p.Name, uid: string(p.UID), container: id, pid: pid}, nil
			}
		}
	}
	return nil, errors.New("no runner process")
}

// containerPid returns the host PID of a container's first process: of
// the processes in the container's cgroup (the kubelet's cgroupfs layout,
// <root>/kubepods/[<qos>/]pod<uid>/<id>), the one whose parent is not in
// it (the shim is outside).
func containerPid(id string) (int, error) {
	var files []string
	for _, pattern := range []string{"/sys/fs/cgroup/pids/*/kubepods/pod*/%s/cgroup.procs", "/sys/fs/cgroup/pids/*/kubepods/*/pod*/%s/cgroup.procs"} {
		m, _ := filepath.Glob(fmt.Sprintf(pattern, id))
		files = append(files, m...)
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("no cgroup for container %s", id)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return 0, err
	}
	in := map[int]bool{}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			in[pid] = true
		}
	}
	for pid := range in {
		if ppid, err := parentPid(pid); err == nil && !in[ppid] {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process in the cgroup of container %s", id)
}

// parentPid reads a process's parent from /proc/<pid>/stat, whose second
// field (the command, in parentheses) may hold spaces.
func parentPid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.Atoi(fields[1])
}

// inContainer reports whether a live process is in the container's cgroup.
func inContainer(pid int, id string) bool {
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && strings.Contains(string(cg), id)
}

// children lists the processes below pid through /proc/<pid>/task/*/children,
// which is cheap enough to call every few milliseconds.
func children(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", next))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}
