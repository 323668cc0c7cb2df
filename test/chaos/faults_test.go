package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/stack"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/pki/casecret"
)

// Fault kinds, the rows of the results table.
const (
	faultKillPlan    = "runner SIGKILL mid-plan"
	faultKillApply   = "runner SIGKILL mid-apply"
	faultKillUpload  = "runner SIGKILL mid-state-upload"
	faultLeaderKill  = "leader controller SIGKILL mid-run"
	faultCARotation  = "controller CA rotated every 10 s"
	faultAPIServer   = "kube-apiserver restarted mid-run"
	faultEtcd        = "etcd restarted mid-run"
	faultPostgres    = "PostgreSQL restarted mid-write"
	faultPodDelete   = "runner pod deleted mid-apply"
	faultNodeRestart = "node rebooted with pods running"
	faultDiskFull    = "disk full in the runner's work dir"
	faultOversize    = "state upload over the maximum"
)

// faultOrder is the order of the table's rows.
var faultOrder = []string{
	faultKillPlan, faultKillApply, faultKillUpload, faultLeaderKill, faultCARotation,
	faultAPIServer, faultEtcd, faultPostgres, faultPodDelete, faultNodeRestart,
	faultDiskFull, faultOversize,
}

// fault is one kind of fault aimed at one run of a workload.
type fault struct {
	name string
	// due is polled (every 10 ms) while the run goes on; the fault is
	// injected once it returns true.
	due func(ctx context.Context, w *workload, seen *progress) bool
	// inject does the damage.
	inject func(ctx context.Context, e *env, w *workload) error
	// global faults hit every run in flight, not only w's.
	global bool
}

// progress is what a trigger has seen of the run so far.
type progress struct {
	slept bool
}

// runningTofu is a trigger: tofu runs subcommand under w's runner.
func runningTofu(sub string) func(context.Context, *workload, *progress) bool {
	return func(ctx context.Context, w *workload, _ *progress) bool {
		r, err := w.runner(ctx)
		return err == nil && r.tofu == sub
	}
}

// applying is a trigger: the module's provisioner waits, so tofu is mid-apply
// with the test provider's files already written and the state not yet saved.
func applying(ctx context.Context, w *workload, _ *progress) bool {
	r, err := w.runner(ctx)
	return err == nil && r.tofu == "apply" && r.sleeping
}

// uploading is a trigger: the provisioner has finished, tofu apply still
// runs, and a large upload is passing the state proxy — tofu is sending the
// state.
func uploading(e *env) func(context.Context, *workload, *progress) bool {
	return func(ctx context.Context, w *workload, seen *progress) bool {
		r, err := w.runner(ctx)
		if err != nil || r.tofu != "apply" {
			return false
		}
		if r.sleeping {
			seen.slept = true
			return false
		}
		return seen.slept && e.stateProxy.uploading.Load() > 0
	}
}

// planStillToWrite is a trigger: the runner runs and has not written its
// plan file yet, so the run still has to write to the work dir. (A runner
// merely seen running may be past that: the kubelet reports a container
// running a while after it started, and an apply of a saved plan with a
// remote state writes nothing there that fails the run.)
func planStillToWrite(ctx context.Context, w *workload, _ *progress) bool {
	r, err := w.runner(ctx)
	if err != nil {
		return false
	}
	root := filepath.Join("/proc", strconv.Itoa(r.pid), "root", runnerWorkDir)
	if _, err := os.Stat(root); err != nil {
		return false
	}
	plans, _ := filepath.Glob(filepath.Join(root, "*", "plans", "*"))
	return len(plans) == 0
}

// killRunner SIGKILLs the runner, the container's first process, as the
// kernel's OOM killer ends a container: tofu and the provider go with the
// container's PID namespace.
func killRunner(ctx context.Context, _ *env, w *workload) error {
	r, err := w.runner(ctx)
	if err != nil {
		return err
	}
	return syscall.Kill(r.pid, syscall.SIGKILL)
}

func deleteRunnerPod(ctx context.Context, e *env, w *workload) error {
	r, err := w.runner(ctx)
	if err != nil {
		return err
	}
	// NotFound: the delete was done, its answer lost to a restart.
	if err := e.cs.CoreV1().Pods(w.ns).Delete(ctx, r.pod, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// fillWorkDir writes zeros into the runner's work directory until the
// node's disk is full: the runner's next write there fails with ENOSPC, as
// on a node whose disk filled up. The work directory is an emptyDir under
// the kubelet's root, on the node's disk (a tmpfs of nodeDiskBytes, see
// mountNodeDisk), reached here through the runner's own root
// (/proc/<pid>/root). The file goes with the pod.
func fillWorkDir(ctx context.Context, e *env, w *workload) error {
	r, err := w.runner(ctx)
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join("/proc", strconv.Itoa(r.pid), "root", runnerWorkDir, "chaos-filler"))
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	// Most of the free space at once (tmpfs allocates it without writing),
	// so the disk is full before the runner's next write; then zeros to
	// the last byte.
	var fs syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &fs); err == nil && fs.Bavail > 256 {
		_ = syscall.Fallocate(int(f.Fd()), 0, 0, int64(fs.Bavail-256)*fs.Bsize)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				go e.logNoSpace(ctx, w)
				return nil
			}
			return err
		}
	}
}

// logNoSpace logs how the run took the full disk: the first failure the
// Stack reports within a minute of the fill (the runner's write refused
// with ENOSPC, or the runner gone), or that none came, which happens when
// the run was past its last write to the work dir.
func (e *env) logNoSpace(ctx context.Context, w *workload) {
	err := poll(ctx, time.Minute, func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		if readyAt(s) == nil {
			e.logf("%s: %s/%s Ready, no failure seen", faultDiskFull, w.ns, w.name)
			return nil
		}
		for _, c := range s.Status.Conditions {
			if c.Type == terracev1.ReadyCondition && c.Status == metav1.ConditionFalse && c.Reason != "Progressing" {
				e.logf("%s: %s/%s failed: %.300s", faultDiskFull, w.ns, w.name, c.Message)
				return nil
			}
		}
		return errors.New("no failure reported")
	})
	if err != nil {
		e.logf("%s: %s/%s: %v", faultDiskFull, w.ns, w.name, err)
	}
}

// runnerWorkDir is the runner container's work directory (launcher's
// emptyDir terrace-work).
const runnerWorkDir = "/var/lib/terrace/work"

func faults(e *env) map[string]fault {
	return map[string]fault{
		faultKillPlan:   {name: faultKillPlan, due: runningTofu("plan"), inject: killRunner},
		faultKillApply:  {name: faultKillApply, due: applying, inject: killRunner},
		faultKillUpload: {name: faultKillUpload, due: uploading(e), inject: killRunner},
		faultPodDelete:  {name: faultPodDelete, due: applying, inject: deleteRunnerPod},
		faultDiskFull:   {name: faultDiskFull, due: planStillToWrite, inject: fillWorkDir},
		faultPostgres: {name: faultPostgres, due: uploading(e), inject: func(context.Context, *env, *workload) error {
			return e.restartPostgres()
		}},
		faultLeaderKill: {name: faultLeaderKill, due: applying, global: true, inject: func(context.Context, *env, *workload) error {
			_, err := e.ctrls.killLeader()
			return err
		}},
		faultAPIServer: {name: faultAPIServer, due: applying, global: true, inject: func(ctx context.Context, e *env, _ *workload) error {
			return e.cluster.Restart(ctx, "kube-apiserver", false)
		}},
		faultEtcd: {name: faultEtcd, due: applying, global: true, inject: func(ctx context.Context, e *env, _ *workload) error {
			return e.cluster.Restart(ctx, "etcd", true)
		}},
		faultNodeRestart: {name: faultNodeRestart, due: applying, global: true, inject: func(ctx context.Context, e *env, _ *workload) error {
			return e.rebootNode(ctx)
		}},
	}
}

// injection is the outcome of one fault.
type injection struct {
	fault     string
	workload  *workload
	affected  int
	recovered bool
	recovery  time.Duration
	err       string
	// logFrom and logTo mark the logs at injection and recovery, for the
	// handshake check.
	logFrom, logTo logMarks
}

// results collects injections and per-workload end checks.
type results struct {
	mu         sync.Mutex
	injections []*injection
	// rotations counts CA rotations and runsDuringRotation the runs that
	// finished while the CA kept rotating.
	rotations          int
	rotationRuns       int
	rotationRecovered  int
	rotationWorst      time.Duration
	rotationLogs       logMarks
	rotationLogsEnd    logMarks
	checks             map[*workload]*endCheck
	workloadFault      map[*workload]string
	missed             map[string]int
	handshakeByFault   map[string][]string
	interruptedByFault map[string]int
}

func newResults() *results {
	return &results{
		checks: map[*workload]*endCheck{}, workloadFault: map[*workload]string{}, missed: map[string]int{},
		handshakeByFault: map[string][]string{}, interruptedByFault: map[string]int{},
	}
}

func (r *results) add(in *injection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.injections = append(r.injections, in)
	r.workloadFault[in.workload] = in.fault
}

// inject runs one more generation of w and injects f into it when due. A
// run that ends before the fault was due is retried, up to 3 times.
func (e *env) inject(ctx context.Context, f fault, w *workload, all []*workload, res *results) *injection {
	return e.injectThen(ctx, f, w, all, res, nil)
}

// injectThen is inject, closing struck (when not nil) once the fault has
// struck or could not.
func (e *env) injectThen(ctx context.Context, f fault, w *workload, all []*workload, res *results, struck chan struct{}) *injection {
	if struck != nil {
		var once sync.Once
		signal := func() { once.Do(func() { close(struck) }) }
		defer signal()
		strike := f.inject
		f.inject = func(ctx context.Context, e *env, w *workload) error {
			defer signal()
			return strike(ctx, e, w)
		}
	}
	in := &injection{fault: f.name, workload: w}
	defer res.add(in)
	defer func() { in.logTo = e.markLogs() }()
	for attempt := 1; ; attempt++ {
		s, err := w.get(ctx)
		creating := attempt == 1 && w.fresh && err == nil && readyAt(s) != nil
		w.fresh = false
		if !creating {
			if err := w.bump(ctx); err != nil {
				in.err = err.Error()
				return in
			}
		}
		seen := &progress{}
		fired := false
		var lastGet time.Time
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if f.due(ctx, w, seen) {
				fired = true
				break
			}
			if time.Since(lastGet) > 250*time.Millisecond {
				lastGet = time.Now()
				if s, err := w.get(ctx); err == nil && readyAt(s) == nil {
					break // the run ended before the fault was due
				}
			}
			time.Sleep(10 * time.Millisecond) // polling interval of the trigger
		}
		if fired {
			break
		}
		res.mu.Lock()
		res.missed[f.name]++
		res.mu.Unlock()
		if attempt == 3 {
			in.err = "the fault was never due in 3 runs"
			return in
		}
		if err := w.waitReady(ctx, recoveryTimeout); err != nil {
			in.err = "before retrying: " + err.Error()
			return in
		}
	}
	in.affected = 1
	if f.global {
		in.affected = 0
		for _, o := range all {
			if _, err := o.runner(ctx); err == nil {
				in.affected++
			}
		}
	}
	in.logFrom = e.markLogs()
	begin := time.Now()
	e.logf("%s: %s/%s struck (generation %d)", f.name, w.ns, w.name, w.currentGeneration())
	if err := f.inject(ctx, e, w); err != nil {
		in.err = "inject: " + err.Error()
		return in
	}
	if err := w.waitReady(ctx, recoveryTimeout); err != nil {
		in.err = err.Error()
		return in
	}
	in.recovered, in.recovery = true, time.Since(begin)
	e.logf("%s: %s/%s recovered in %s", f.name, w.ns, w.name, in.recovery.Round(100*time.Millisecond))
	return in
}

// injectOversize raises the Stack's state over the state server's maximum.
// Recovered means: the run fails with a message that says so, the state and
// lock are untouched, and once the input is put back the Stack is Ready.
func (e *env) injectOversize(ctx context.Context, w *workload, res *results) *injection {
	in := &injection{fault: faultOversize, workload: w, affected: 1}
	defer res.add(in)
	defer func() { in.logTo = e.markLogs() }()
	in.logFrom = e.markLogs()
	begin := time.Now()
	// The input alone is over the maximum, so the plan says the state
	// would be: refused before anything is applied (StateTooLarge). A
	// fresh workload was created so (createWorkloads): its first run is
	// the one refused.
	if w.fresh {
		w.fresh = false
	} else {
		w.pad = oversizePad
		if err := w.bump(ctx); err != nil {
			in.err = err.Error()
			return in
		}
	}
	var message string
	err := poll(ctx, recoveryTimeout, func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		for _, c := range s.Status.Conditions {
			if c.Type == terracev1.ReadyCondition && c.Status == metav1.ConditionFalse && c.ObservedGeneration == s.Generation &&
				c.Reason == stack.StateTooLargeReason && strings.Contains(c.Message, "limit") {
				message = c.Message
				return nil
			}
		}
		return fmt.Errorf("no failure naming the state's size: %s", conditionsText(s))
	})
	if err != nil {
		in.err = err.Error()
		return in
	}
	in.recovery = time.Since(begin)
	e.logf("%s: %s/%s failed clearly in %s: %s", faultOversize, w.ns, w.name, in.recovery.Round(100*time.Millisecond), message)
	// The refused upload comes at the end of an apply: whatever the apply
	// changed must still be in a stored state, or it is lost.
	if lost := w.diskAheadOfState(ctx); lost != "" {
		w.mu.Lock()
		w.stateErrors = append(w.stateErrors, lostAfterRefusedUpload+": "+lost)
		w.mu.Unlock()
	}
	w.pad = 0
	if err := w.bump(ctx); err != nil {
		in.err = err.Error()
		return in
	}
	if err := w.waitReady(ctx, recoveryTimeout); err != nil {
		in.err = "after putting the input back: " + err.Error()
		return in
	}
	in.recovered = true
	e.logf("%s: %s/%s Ready with the input put back", faultOversize, w.ns, w.name)
	return in
}

// rotateCA writes a new current CA into the controller's CA Secret every
// interval until ctx ends, keeping as previous the CA that issues (the
// oldest, activated one), so that both stay trusted: the churn a replica
// sees in a rotation, at a rate no real one reaches. It returns the count.
func (e *env) rotateCA(ctx context.Context, interval time.Duration) int {
	key := types.NamespacedName{Namespace: operatorNamespace, Name: "terrace-ca"}
	var issuing []byte
	var issuingKey []byte
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n
		case <-time.After(interval):
		}
		err := func() error {
			var s corev1.Secret
			if err := e.c.Get(ctx, key, &s); err != nil {
				return err
			}
			if issuing == nil {
				issuing, issuingKey = s.Data[casecret.SecretKeyCACert], s.Data[casecret.SecretKeyCAKey]
				if len(s.Data[casecret.SecretKeyPreviousCACert]) > 0 {
					issuing, issuingKey = s.Data[casecret.SecretKeyPreviousCACert], s.Data[casecret.SecretKeyPreviousCAKey]
				}
			}
			next, err := pki.GenerateCA(pki.DefaultCAValidity, time.Now())
			if err != nil {
				return err
			}
			s.Data = map[string][]byte{
				casecret.SecretKeyCACert: next.CertPEM(), casecret.SecretKeyCAKey: next.KeyPEM(),
				casecret.SecretKeyPreviousCACert: issuing, casecret.SecretKeyPreviousCAKey: issuingKey,
			}
			return e.c.Update(ctx, &s)
		}()
		if err == nil {
			n++
		} else if !errors.Is(err, context.Canceled) {
			e.t.Logf("CA rotation failed: %v", err)
		}
	}
}

// lostAfterRefusedUpload starts the problem diskAheadOfState finds after
// the oversize fault.
const lostAfterRefusedUpload = "the apply changed resources that no stored state records (its state was refused as too large)"

// diskAheadOfState compares the files on disk with those the stored state
// records, and describes a difference.
func (w *workload) diskAheadOfState(ctx context.Context) string {
	store, _, closeStore, err := w.store(ctx)
	if err != nil {
		return ""
	}
	defer closeStore()
	st, err := store.Get(ctx, w.key())
	if err != nil {
		return ""
	}
	recorded, err := fileContents(st.Data)
	if err != nil {
		return ""
	}
	onDisk := w.filesOnDisk()
	if equalMaps(recorded, onDisk) {
		return ""
	}
	return fmt.Sprintf("files on disk %v, state serial %d records %v", onDisk, st.Serial, recorded)
}

// recoveryTimeout bounds every wait for a Stack to recover or fail. It is
// generous: on a loaded two-core machine one run took over a minute.
const recoveryTimeout = 10 * time.Minute
