package chaos

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// plan says how often each fault is injected.
type plan struct {
	counts map[string]int
	// lifecycles is how many create/approve/drift rounds the lifecycle
	// Stacks (up to spread of them, side by side) go through under CA
	// rotation.
	lifecycles int
	// rotateEvery is the CA rotation interval.
	rotateEvery time.Duration
	// overlap runs the cluster faults (but disk-full) during phase one
	// instead of after it, and every fault but disk-full hits the run that
	// creates its Stack: quicker, at the cost of telling apart which fault
	// a symptom came from. The smoke test overlaps.
	overlap bool
	// spread is how many workloads share each runner fault's injections
	// (spreadFaults), side by side: each still takes one fault at a time.
	// At most 1 unless set.
	spread int
	// injectFor, when set, bounds the time faults are injected in: after
	// it no fault starts but each kind's first, the runs in flight
	// recover, and the end checks and table cover what was injected (a
	// long run on a deadline).
	injectFor time.Duration
}

// injecting reports whether p allows another fault to start.
func (p plan) injecting(begin time.Time) bool {
	return p.injectFor <= 0 || time.Since(begin) < p.injectFor
}

// spreadFaults are the faults that hit only their own workload's runner,
// so several workloads can take them at once. PostgreSQL restarts the one
// server, and the oversize fault is cheap: one workload each.
var spreadFaults = map[string]bool{faultKillPlan: true, faultKillApply: true, faultKillUpload: true, faultPodDelete: true}

// issueCounts are the counts of issue 16; faults it gives no count for
// get a few.
var issueCounts = map[string]int{
	faultKillPlan: 20, faultKillApply: 20, faultKillUpload: 20,
	faultLeaderKill: 5, faultAPIServer: 3, faultEtcd: 2, faultPostgres: 5,
	faultPodDelete: 5, faultNodeRestart: 3, faultDiskFull: 3, faultOversize: 3,
}

// TestChaosSmoke injects each fault once; part of `make test`.
func TestChaosSmoke(t *testing.T) {
	counts := map[string]int{}
	for f := range issueCounts {
		counts[f] = 1
	}
	lifecycles := 1
	if !selectFaults(t, counts) {
		lifecycles = 0
	}
	runChaos(t, plan{counts: counts, lifecycles: lifecycles, rotateEvery: 10 * time.Second, overlap: true})
}

// selectFaults drops from counts the faults TERRACE_CHAOS_FAULTS does not
// name (a comma-separated list of the table's rows as slugs, such as
// runner-sigkill-mid-plan,node-rebooted-with-pods-running), to run one
// fault or a few; unset, it keeps them all. It reports whether the CA
// rotation row (controller-ca-rotated-every-10-s, whose runs are the
// lifecycle Stacks') is kept. The CA rotates during phase one whatever
// is named.
func selectFaults(t *testing.T, counts map[string]int) bool {
	names := os.Getenv("TERRACE_CHAOS_FAULTS")
	if names == "" {
		return true
	}
	want := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		want[strings.TrimSpace(n)] = true
	}
	known := map[string]bool{}
	for _, f := range faultOrder {
		known[slug(f)] = true
	}
	for n := range want {
		if !known[n] {
			t.Fatalf("TERRACE_CHAOS_FAULTS names %q, not a fault; the faults are %v", n, slices.Sorted(maps.Keys(known)))
		}
	}
	for f := range counts {
		if !want[slug(f)] {
			delete(counts, f)
		}
	}
	return want[slug(faultCARotation)]
}

// knownBugs are problems the harness found whose fix belongs to code the
// harness does not own (docs/reliability.md, "Found"). Each is logged and
// counted in the table without failing the test; remove an entry with its
// fix, and the test fails again when the problem shows.
var knownBugs = []struct {
	// fault is the row the problem is known in; "" for any.
	fault string
	// problem is a part of the end check's words for it.
	problem string
}{}

func knownBug(fault, problem string) bool {
	for _, k := range knownBugs {
		if (k.fault == "" || k.fault == fault) && strings.Contains(problem, k.problem) {
			return true
		}
	}
	return false
}

// phaseOne faults hit one run each and can run side by side, each on a
// workload of its own, while the CA keeps rotating.
var phaseOne = []string{faultKillPlan, faultKillApply, faultKillUpload, faultPodDelete, faultPostgres, faultOversize}

// phaseTwo faults hit the whole cluster or node: one at a time. Disk-full
// fills the node's disk for its own run only, so it always runs alone, last.
var (
	clusterFaults = []string{faultLeaderKill, faultAPIServer, faultEtcd, faultNodeRestart}
	phaseTwo      = append(append([]string{}, clusterFaults...), faultDiskFull)
)

func runChaos(t *testing.T, p plan) {
	begin := time.Now()
	e := startEnv(t)
	t.Logf("environment up in %s", time.Since(begin).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	res := newResults()
	kinds := faults(e)

	// Every workload starts now and gets Ready at generation 1.
	spread, all := e.createWorkloads(ctx, t, p)
	workloads := map[string]*workload{}
	for f, ws := range spread {
		workloads[f] = ws[0]
		for _, w := range ws {
			// Hit during the run that creates the Stack: one run fewer.
			// Disk-full, last, takes a run of its own.
			w.fresh = f != faultDiskFull
		}
	}
	if !p.overlap {
		// Side by side: each wait is a first run.
		var readyWG sync.WaitGroup
		for f, w := range workloads {
			if w.fresh && spreadFaults[f] {
				continue
			}
			w.fresh = false
			readyWG.Add(1)
			go func() {
				defer readyWG.Done()
				if err := w.waitReady(ctx, recoveryTimeout); err != nil {
					t.Errorf("workload for %s never got Ready at generation 1: %v", f, err)
				}
			}()
		}
		readyWG.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d workloads created, those to be hit after their first run Ready, after %s", len(all), time.Since(begin).Round(100*time.Millisecond))

	// Phase one, under CA rotation.
	rotateCtx, stopRotating := context.WithCancel(ctx)
	rotations := make(chan int, 1)
	res.rotationLogs = e.markLogs()
	go func() { rotations <- e.rotateCA(rotateCtx, p.rotateEvery) }()
	var wg sync.WaitGroup
	for _, f := range phaseOne {
		ws := spread[f]
		for i, w := range ws {
			n := share(p.counts[f], len(ws), i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.phaseOneRuns(ctx, t, p, f, w, n, res)
			}()
		}
	}
	if p.overlap {
		// Each cluster fault waits for the one before it to strike, not
		// to recover: their recoveries overlap.
		previous := make(chan struct{})
		close(previous)
		for _, f := range clusterFaults {
			w := workloads[f]
			if w == nil {
				continue
			}
			wait, struck := previous, make(chan struct{})
			previous = struck
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-wait
				if in := e.injectThen(ctx, kinds[f], w, all, res, struck); in.err != "" {
					t.Errorf("%s on %s/%s: %s", f, w.ns, w.name, in.err)
				}
			}()
		}
	}
	// The lifecycle rounds, shared out like the runner faults: each
	// lifecycle Stack is created, goes through its rounds and is destroyed.
	var lifecycles []*lifecycleRuns
	if p.lifecycles > 0 {
		lifecycles = make([]*lifecycleRuns, max(1, min(p.spread, p.lifecycles)))
	}
	for i := range lifecycles {
		lifecycle := &lifecycleRuns{}
		lifecycles[i] = lifecycle
		wg.Add(1)
		go func() {
			defer wg.Done()
			lifecycle.run(ctx, t, e, share(p.lifecycles, len(lifecycles), i), res)
		}()
	}
	wg.Wait()
	stopRotating()
	res.rotations = <-rotations
	res.rotationLogsEnd = e.markLogs()
	res.mu.Lock()
	for _, in := range res.injections {
		res.rotationRuns++
		if in.recovered {
			res.rotationRecovered++
		}
	}
	res.mu.Unlock()
	for _, lifecycle := range lifecycles {
		res.rotationRuns += lifecycle.runs
		res.rotationRecovered += lifecycle.ready
	}
	t.Logf("phase one (runner faults under %d CA rotations) done after %s", res.rotations, time.Since(begin).Round(100*time.Millisecond))

	if !p.overlap {
		e.phaseTwo(ctx, t, p, workloads, all, clusterFaults, res)
	}
	e.phaseTwo(ctx, t, p, workloads, all, []string{faultDiskFull}, res)
	t.Logf("phase two (cluster faults) done after %s", time.Since(begin).Round(100*time.Millisecond))

	// End checks.
	var checkWG sync.WaitGroup
	for _, w := range all {
		checkWG.Add(1)
		go func() {
			defer checkWG.Done()
			c := w.check(ctx)
			res.mu.Lock()
			res.checks[w] = c
			res.mu.Unlock()
		}()
	}
	checkWG.Wait()
	for _, lifecycle := range lifecycles {
		if lifecycle.check != nil {
			res.checks[lifecycle.w] = lifecycle.check
		}
	}
	for w, c := range res.checks {
		f := res.workloadFault[w]
		for _, problem := range c.problems() {
			if knownBug(f, problem) {
				t.Logf("known bug (docs/reliability.md, \"Found\"): %s/%s (%s): %s", w.ns, w.name, f, problem)
				continue
			}
			t.Errorf("%s/%s (%s): %s", w.ns, w.name, f, problem)
		}
	}

	// Handshake failures, by the window of each fault.
	for _, in := range res.injections {
		failures, interrupted := e.handshakes(in.logFrom, in.logTo)
		res.handshakeByFault[in.fault] = appendNew(res.handshakeByFault[in.fault], failures)
		res.interruptedByFault[in.fault] += interrupted
	}
	failures, interrupted := e.handshakes(res.rotationLogs, res.rotationLogsEnd)
	res.handshakeByFault[faultCARotation] = failures
	res.interruptedByFault[faultCARotation] = interrupted
	all_, interruptedAll := e.handshakes(nil, nil)
	for _, line := range all_ {
		t.Errorf("TLS handshake failure logged: %s", line)
	}

	table := markdown(res.table())
	t.Logf("results after %s:\n%s", time.Since(begin).Round(time.Second), table)
	fmt.Printf("\n%s\n", table)
	var notes []string
	for _, f := range faultOrder {
		if n := res.missed[f]; n > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d run(s) ended before the fault was due and were repeated", f, n))
		}
	}
	notes = append(notes, fmt.Sprintf("handshakes cut short by a killed or restarted peer (not counted as failures): %d", interruptedAll))
	fmt.Println(strings.Join(notes, "\n"))
	if path := os.Getenv("TERRACE_CHAOS_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(table+"\n"+strings.Join(notes, "\n")+"\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		for _, r := range e.ctrls.replicas {
			t.Logf("%s log (last 40 lines):\n%s", r.name, tail(r.logPath, 40))
		}
	}
	// TERRACE_CHAOS_KEEP_LOGS=dir keeps every controller and runner log.
	if keep := os.Getenv("TERRACE_CHAOS_KEEP_LOGS"); keep != "" {
		_ = os.MkdirAll(keep, 0o755)
		for _, f := range e.logFiles() {
			if b, err := os.ReadFile(f); err == nil {
				_ = os.WriteFile(filepath.Join(keep, strings.ReplaceAll(strings.TrimPrefix(f, e.dir+"/"), "/", "_")), b, 0o644)
			}
		}
	}
}

// clusterSleep is the provisioner's sleep (seconds) of the smoke's
// cluster-fault Stacks but the first.
const clusterSleep = 30

// share is part i's share of total shared out over parts.
func share(total, parts, i int) int {
	n := total / parts
	if i < total%parts {
		n++
	}
	return n
}

// phaseOneRuns injects fault f into n runs of w, one after the other.
func (e *env) phaseOneRuns(ctx context.Context, t *testing.T, p plan, f string, w *workload, n int, res *results) {
	for i := range n {
		if i > 0 && !p.injecting(e.begin) {
			e.logf("%s on %s/%s: no more faults, the time for them is over", f, w.ns, w.name)
			return
		}
		var in *injection
		if f == faultOversize {
			in = e.injectOversize(ctx, w, res)
		} else {
			in = e.inject(ctx, faults(e)[f], w, nil, res)
		}
		if in.err != "" {
			t.Errorf("%s on %s/%s: %s", f, w.ns, w.name, in.err)
			return
		}
	}
}

// createWorkloads creates the workloads the plan injects faults into, side
// by side (each waits seconds for its namespace's ServiceAccount): one per
// fault, p.spread for each of spreadFaults.
func (e *env) createWorkloads(ctx context.Context, t *testing.T, p plan) (map[string][]*workload, []*workload) {
	var kinds []string
	for _, f := range append(append([]string{}, phaseOne...), phaseTwo...) {
		if p.counts[f] > 0 && (f != faultDiskFull || e.nodeOnTmpfs) {
			n := 1
			if spreadFaults[f] {
				n = max(1, min(p.spread, p.counts[f]))
			}
			for range n {
				kinds = append(kinds, f)
			}
		}
	}
	made := make([]*workload, len(kinds))
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, f := range kinds {
		pad := 0
		switch {
		case f == faultKillUpload || f == faultPostgres:
			pad = uploadPad
		case f == faultOversize && p.overlap:
			// Hit during the run that creates the Stack: created over
			// the limit.
			pad = oversizePad
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleep := 0
			if p.overlap && slices.Contains(clusterFaults, f) && f != clusterFaults[0] {
				// The cluster faults strike one after the other, each
				// mid-apply of its own Stack: a long window lets the
				// next strike in the same run when the one before it
				// spared it, instead of a run later.
				sleep = clusterSleep
			}
			made[i], errs[i] = e.newWorkload(ctx, workloadSpec{name: slug(f), files: 2, pad: pad, postgres: f == faultPostgres, sleep: sleep})
		}()
	}
	wg.Wait()
	workloads := map[string][]*workload{}
	for i, f := range kinds {
		if errs[i] != nil {
			t.Fatalf("failed to create the workload for %s: %v", f, errs[i])
		}
		workloads[f] = append(workloads[f], made[i])
	}
	return workloads, made
}

// phaseTwo injects the faults of kinds one at a time. Without overlap,
// every phase-two workload runs at once and a global fault hits them all.
func (e *env) phaseTwo(ctx context.Context, t *testing.T, p plan, workloads map[string]*workload, all []*workload, kinds []string, res *results) {
	defs := faults(e)
	var group []*workload
	for _, f := range phaseTwo {
		if w := workloads[f]; w != nil && f != faultDiskFull && !p.overlap {
			group = append(group, w)
		}
	}
	for _, f := range kinds {
		w := workloads[f]
		if w == nil {
			continue
		}
		for i := range p.counts[f] {
			if i > 0 && !p.injecting(e.begin) {
				e.logf("%s: no more faults, the time for them is over", f)
				break
			}
			var companions []*workload
			if defs[f].global {
				for _, o := range group {
					if o != w {
						companions = append(companions, o)
					}
				}
			}
			in := e.injectWith(ctx, defs[f], w, companions, all, res)
			if in.err != "" {
				t.Errorf("%s on %s/%s: %s", f, w.ns, w.name, in.err)
				break
			}
		}
	}
}

// injectWith is inject with companions: workloads whose runs go on at the
// same time and that must recover too.
func (e *env) injectWith(ctx context.Context, f fault, w *workload, companions, all []*workload, res *results) *injection {
	for _, o := range companions {
		if err := o.bump(ctx); err != nil {
			return &injection{fault: f.name, workload: w, err: err.Error()}
		}
	}
	in := e.inject(ctx, f, w, all, res)
	for _, o := range companions {
		if err := o.waitReady(ctx, recoveryTimeout); err != nil {
			in.err = fmt.Sprintf("companion %s/%s: %v", o.ns, o.name, err)
			in.recovered = false
		}
	}
	in.logTo = e.markLogs()
	return in
}

func appendNew(have, more []string) []string {
	seen := map[string]bool{}
	for _, h := range have {
		seen[h] = true
	}
	for _, m := range more {
		if !seen[m] {
			have = append(have, m)
			seen[m] = true
		}
	}
	return have
}

// slug makes a Stack name of a fault's name.
func slug(f string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(f) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String()[:min(b.Len(), 40)], "-")
}

// lifecycleRuns drives one Stack through what users do, while the CA
// rotates: a change approved by plan id, a drift repaired, and in the end
// a destroy.
type lifecycleRuns struct {
	w     *workload
	runs  int
	ready int
	check *endCheck
}

func (l *lifecycleRuns) run(ctx context.Context, t *testing.T, e *env, rounds int, res *results) {
	// Created waiting for approval: its first plan is approved by id.
	w, err := e.newWorkload(ctx, workloadSpec{name: "lifecycle", files: 2, awaitApproval: true})
	if err != nil {
		t.Errorf("lifecycle: %v", err)
		return
	}
	l.w = w
	res.mu.Lock()
	res.workloadFault[w] = faultCARotation
	res.mu.Unlock()
	step := func(what string, do func() error) bool {
		l.runs++
		begin := time.Now()
		if err := do(); err != nil {
			t.Errorf("lifecycle %s/%s: %s: %v", w.ns, w.name, what, err)
			return false
		}
		l.ready++
		e.logf("lifecycle %s/%s: %s in %s", w.ns, w.name, what, time.Since(begin).Round(100*time.Millisecond))
		return true
	}
	if !step("create, approved by plan id", func() error { return w.approvePending(ctx) }) {
		return
	}
	for round := range rounds {
		// The first round's change approved by plan id is the creation's.
		if round > 0 && !step("a change approved by plan id", func() error {
			w.mu.Lock()
			w.generation++
			w.mu.Unlock()
			if err := w.update(ctx, func(s *terracev1.Stack) { s.Spec.Vars, s.Spec.ApprovePlan = w.vars(), "" }); err != nil {
				return err
			}
			return w.approvePending(ctx)
		}) {
			return
		}
		ok := step("a drift repaired", func() error {
			if err := w.waitReady(ctx, recoveryTimeout); err != nil {
				return err
			}
			path := filepath.Join(w.dir, "file-0.txt")
			if err := os.WriteFile(path, []byte("edited by hand"), 0o644); err != nil {
				return err
			}
			// Drift checks only now: every check is a run, and runs are
			// what the machine is short of.
			if err := w.setDriftChecks(ctx, terracev1.DriftDetectionEnabled, 5*time.Second); err != nil {
				return err
			}
			defer func() { _ = w.setDriftChecks(ctx, terracev1.DriftDetectionDisabled, 0) }()
			return poll(ctx, recoveryTimeout, func() error {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				w.mu.Lock()
				want := fmt.Sprintf("generation %d", w.generation)
				w.mu.Unlock()
				if string(b) != want {
					return fmt.Errorf("file-0.txt holds %q", b)
				}
				return nil
			})
		})
		if !ok {
			return
		}
	}
	if err := w.waitReady(ctx, recoveryTimeout); err != nil {
		t.Errorf("lifecycle %s/%s: after the drift: %v", w.ns, w.name, err)
	}
	// The end checks, then the destroy: the Stack, its files, its state
	// and its runner objects all go.
	l.check = w.check(ctx)
	step("destroy", func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		if err := e.c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return poll(ctx, recoveryTimeout, func() error {
			_, err := w.get(ctx)
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("the Stack is still there (%v)", err)
		})
	})
	entries, _ := os.ReadDir(w.dir)
	if len(entries) > 0 {
		l.check.files = append(l.check.files, fmt.Sprintf("destroy left %d files in %s", len(entries), w.dir))
	}
	if store, _, closeStore, err := w.store(ctx); err == nil {
		if st, err := store.Get(ctx, w.key()); err == nil && st != nil {
			l.check.lostState = append(l.check.lostState, fmt.Sprintf("destroy left state serial %d", st.Serial))
		}
		closeStore()
	}
}

// approvePending waits for the plan of the Stack's generation, approves it
// by id until the Stack is Ready, and goes back to approvePlan auto.
func (w *workload) approvePending(ctx context.Context) error {
	var pending string
	if err := poll(ctx, recoveryTimeout, func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		if s.Status.Plan == nil || s.Status.Plan.Pending == "" || s.Status.ObservedGeneration != s.Generation {
			return fmt.Errorf("no plan pending: %s", conditionsText(s))
		}
		pending = s.Status.Plan.Pending
		return nil
	}); err != nil {
		return err
	}
	if err := w.approveUntilReady(ctx, pending); err != nil {
		return err
	}
	return w.update(ctx, func(s *terracev1.Stack) { s.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
}

// approveUntilReady approves plan and waits for Ready. A plan that can no
// longer be applied (the state changed under it: a run of a killed leader
// finishing) is discarded and planned again, and a person approves the new
// one, as the harness does here.
func (w *workload) approveUntilReady(ctx context.Context, plan string) error {
	if err := w.update(ctx, func(s *terracev1.Stack) { s.Spec.ApprovePlan = plan }); err != nil {
		return err
	}
	return poll(ctx, recoveryTimeout, func() error {
		s, err := w.get(ctx)
		if err != nil {
			return err
		}
		if p := s.Status.Plan; p != nil && p.Pending != "" && p.Pending != s.Spec.ApprovePlan && s.Status.ObservedGeneration == s.Generation {
			next := p.Pending
			if err := w.update(ctx, func(s *terracev1.Stack) { s.Spec.ApprovePlan = next }); err != nil {
				return err
			}
			return fmt.Errorf("plan %s replaced by %s, approved again", plan, next)
		}
		return readyAt(s)
	})
}
