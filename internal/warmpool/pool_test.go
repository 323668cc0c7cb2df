package warmpool

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/terrace-dev/terrace/internal/launcher"
)

// fakeWarm is a warm pod of the fake launcher.
type fakeWarm struct {
	id     string
	pod    types.NamespacedName
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	err    error
	closed bool
}

func (w *fakeWarm) ID() string                { return w.id }
func (w *fakeWarm) Pod() types.NamespacedName { return w.pod }
func (w *fakeWarm) Done() <-chan struct{}     { return w.done }
func (w *fakeWarm) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *fakeWarm) end(err error) {
	w.once.Do(func() {
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		close(w.done)
	})
}

func (w *fakeWarm) Close(context.Context) error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.end(errors.New("closed"))
	return nil
}

// fakeLauncher starts fake warm pods at once; failNext makes starts fail.
type fakeLauncher struct {
	mu       sync.Mutex
	started  []*fakeWarm
	foreign  []*corev1.Pod
	adopted  []string
	deleted  []string
	failNext bool
	// inCache lists each started pod as WarmPods does once the cache has
	// it; during runs inside StartWarm, as a sync meanwhile would.
	inCache    bool
	cacheClass string
	during     func()
}

func (l *fakeLauncher) StartWarm(_ context.Context, spec launcher.WarmSpec) (Warm, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failNext {
		return nil, errors.New("no such ServiceAccount")
	}
	id := spec.RunID
	w := &fakeWarm{id: id, pod: types.NamespacedName{Namespace: spec.Namespace, Name: launcher.WarmPodName(id)}, done: make(chan struct{})}
	l.started = append(l.started, w)
	if l.inCache {
		// The pod is in the cache, unclaimed, before the start returns.
		l.foreign = append(l.foreign, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: w.pod.Name, Labels: map[string]string{launcher.LabelWarmClass: l.cacheClass}}})
	}
	if l.during != nil {
		l.mu.Unlock()
		l.during()
		l.mu.Lock()
	}
	return w, nil
}

func (l *fakeLauncher) AdoptWarm(_ context.Context, pod *corev1.Pod) (Warm, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.adopted = append(l.adopted, pod.Name)
	id := pod.Name[len("terrace-warm-"):]
	return &fakeWarm{id: id, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, done: make(chan struct{})}, nil
}

func (l *fakeLauncher) WarmPods(context.Context, string) ([]*corev1.Pod, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*corev1.Pod(nil), l.foreign...), nil
}

func (l *fakeLauncher) DeleteWarm(_ context.Context, pod *corev1.Pod) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deleted = append(l.deleted, pod.Name)
	return nil
}

func (l *fakeLauncher) startedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.started)
}

// demand is a settable Demand.
type demand struct {
	mu    sync.Mutex
	wants []Want
}

func (d *demand) set(w ...Want) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wants = w
}

func (d *demand) get(context.Context) ([]Want, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Want(nil), d.wants...), nil
}

// settled syncs until the pool's ready pods of namespace reach want.
func settled(t *testing.T, p *Pool, namespace string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Ready(namespace) != want {
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s has %d ready warm pods, want %d", namespace, p.Ready(namespace), want)
		}
		p.Sync(context.Background())
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPoolKeepsCountAndHandsOutEachPodOnce(t *testing.T) {
	l := &fakeLauncher{}
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: 2})
	p := New(Options{Launcher: l, Demand: d.get})
	settled(t, p, "team-a", 2)

	if id := p.Reserve("team-a", "other-class", "team-a/web"); id != "" {
		t.Errorf("a run of another class reserved %s", id)
	}
	if id := p.Reserve("team-b", "c1", "team-b/web"); id != "" {
		t.Errorf("a run of another namespace reserved %s", id)
	}
	id := p.Reserve("team-a", "c1", "team-a/web")
	if id == "" {
		t.Fatal("no warm pod reserved although two are ready")
	}
	if p.Take("team-a", "team-a/db", id) != nil {
		t.Error("another Stack took the pod reserved for team-a/web")
	}
	w := p.Take("team-a", "team-a/web", id)
	if w == nil || w.ID() != id {
		t.Fatalf("Take(%s) = %v", id, w)
	}
	if again := p.Take("team-a", "team-a/web", id); again != nil {
		t.Error("a warm pod was handed out twice")
	}
	// The replacement keeps two ready, and the taken pod is not among them.
	settled(t, p, "team-a", 2)
	if got := l.startedCount(); got != 3 {
		t.Errorf("started %d pods, want 3 (two, then one replacement)", got)
	}
	seen := map[string]bool{id: true}
	for range 2 {
		next := p.Reserve("team-a", "c1", "team-a/web")
		if next == "" || seen[next] {
			t.Fatalf("reserved %q after %v: a pod was reused or missing", next, seen)
		}
		seen[next] = true
	}
}

func TestPoolReplacesDeadPodsAndRemovesUnwanted(t *testing.T) {
	l := &fakeLauncher{}
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: 1})
	p := New(Options{Launcher: l, Demand: d.get})
	settled(t, p, "team-a", 1)
	first := l.started[0]
	first.end(errors.New("OOMKilled"))
	settled(t, p, "team-a", 1)
	if l.startedCount() != 2 {
		t.Fatalf("a dead warm pod was not replaced: %d started", l.startedCount())
	}

	// The config drops warm (or the namespace goes): its pods are deleted.
	d.set()
	settled(t, p, "team-a", 0)
	l.mu.Lock()
	second := l.started[1]
	l.mu.Unlock()
	second.mu.Lock()
	closed := second.closed
	second.mu.Unlock()
	if !closed {
		t.Error("the warm pod of a config that dropped warm was not deleted")
	}
}

func TestPoolAdoptsAFormerLeadersPodsAndDeletesTheRest(t *testing.T) {
	warmPod := func(ns, class, id string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: launcher.WarmPodName(id), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{launcher.LabelWarmClass: class}}}
	}
	l := &fakeLauncher{foreign: []*corev1.Pod{
		warmPod("team-a", "c1", "aaaa1111"),
		warmPod("team-a", "c1", "bbbb2222"),
		warmPod("team-a", "old-class", "cccc3333"),
		warmPod("gone-ns", "c1", "dddd4444"),
	}}
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: 1})
	p := New(Options{Launcher: l, Demand: d.get})
	settled(t, p, "team-a", 1)
	p.Sync(context.Background())
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.adopted) != 1 || len(l.started) != 0 {
		t.Errorf("adopted %v and started %d, want one adopted and none started", l.adopted, len(l.started))
	}
	deleted := map[string]bool{}
	for _, n := range l.deleted {
		deleted[n] = true
	}
	for _, n := range []string{launcher.WarmPodName("cccc3333"), launcher.WarmPodName("dddd4444")} {
		if !deleted[n] {
			t.Errorf("unwanted warm pod %s was not deleted (deleted: %v)", n, l.deleted)
		}
	}
}

func TestPoolBacksOffAClassThatFailsToStart(t *testing.T) {
	l := &fakeLauncher{failNext: true}
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: 1})
	p := New(Options{Launcher: l, Demand: d.get})
	p.Sync(context.Background())
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		failed := !p.failed["team-a/c1"].IsZero()
		p.mu.Unlock()
		if failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the failed start was not recorded")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.mu.Lock()
	l.failNext = false
	l.mu.Unlock()
	p.Sync(context.Background())
	// fill decides synchronously: a start would already hold a placeholder.
	p.mu.Lock()
	held := len(p.pods)
	p.mu.Unlock()
	if held != 0 {
		t.Errorf("the pool started %d pods right after a failure, want none until the backoff passes", held)
	}
}

// TestPoolLeavesATakenPodAlone: until the cache shows a taken pod claimed,
// it still looks like an unclaimed warm pod; the pool must neither adopt
// nor delete it (that would kill the run that just claimed it).
func TestPoolLeavesATakenPodAlone(t *testing.T) {
	l := &fakeLauncher{}
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: 1})
	p := New(Options{Launcher: l, Demand: d.get})
	settled(t, p, "team-a", 1)
	id := p.Reserve("team-a", "c1", "team-a/web")
	w := p.Take("team-a", "team-a/web", id)
	if w == nil {
		t.Fatal("nothing to take")
	}
	l.mu.Lock()
	l.foreign = append(l.foreign, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: w.Pod().Name,
		CreationTimestamp: metav1.Now(), Labels: map[string]string{launcher.LabelWarmClass: "c1"}}})
	l.mu.Unlock()
	settled(t, p, "team-a", 1)
	p.Sync(context.Background())
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range append(append([]string(nil), l.deleted...), l.adopted...) {
		if n == w.Pod().Name {
			t.Fatalf("the pool adopted or deleted the pod it handed to a run (deleted %v, adopted %v)", l.deleted, l.adopted)
		}
	}
}

// Found by the 1000-Stack fleet: a sync while a warm pod was starting saw
// the new pod in the cache under a name the pool did not hold yet, took it
// for a former leader's and deleted it; the start then failed and backed
// the class off, one pod short.
func TestPoolKeepsThePodsItIsStarting(t *testing.T) {
	l := &fakeLauncher{inCache: true, cacheClass: "c1"}
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: 2})
	p := New(Options{Launcher: l, Demand: d.get})
	l.during = func() { p.Sync(context.Background()) }
	settled(t, p, "team-a", 2)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.deleted) != 0 || len(l.adopted) != 0 || len(l.started) != 2 {
		t.Fatalf("deleted %v, adopted %v, started %d: want the two pods being started kept, and nothing else", l.deleted, l.adopted, len(l.started))
	}
}

// runningPool starts a pool wanting count pods of team-a/c1 that syncs
// only when woken (its resync is an hour), and waits until they are ready.
func runningPool(t *testing.T, l *fakeLauncher, count int) *Pool {
	t.Helper()
	d := &demand{}
	d.set(Want{Namespace: "team-a", Class: "c1", Count: count})
	p := New(Options{Launcher: l, Demand: d.get, Resync: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = p.Start(ctx) }()
	for p.Ready("team-a") < count {
		time.Sleep(5 * time.Millisecond)
	}
	return p
}

// waitForStarts waits until want warm pods were started in all.
func waitForStarts(t *testing.T, l *fakeLauncher, want int, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); l.startedCount() < want; {
		if time.Now().After(deadline) {
			t.Fatalf("%d warm pods started, want %d: %s", l.startedCount(), want, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A taken pod's replacement starts when its run ends (RunEnded), not when
// it is reserved or claimed: started then, it would take the CPU the run
// needs. A pod that dies while warm is replaced at once.
func TestPoolReplacesATakenPodWhenItsRunEnds(t *testing.T) {
	l := &fakeLauncher{}
	p := runningPool(t, l, 1)
	waitStarted := func(want int, what string) { t.Helper(); waitForStarts(t, l, want, what) }
	id := p.Reserve("team-a", "c1", "team-a/web")
	w := p.Take("team-a", "team-a/web", id)
	if w == nil {
		t.Fatal("nothing to take")
	}
	w.(*fakeWarm).end(errors.New("claimed")) // the claim ends the warm handle
	time.Sleep(50 * time.Millisecond)        // a wake would start one meanwhile
	if n := l.startedCount(); n != 1 {
		t.Fatalf("%d warm pods started while the run that took one goes on, want 1", n)
	}
	p.RunEnded()
	waitStarted(2, "the replacement once the run ended")
	for p.Ready("team-a") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	l.mu.Lock()
	dying := l.started[1]
	l.mu.Unlock()
	dying.end(errors.New("OOMKilled"))
	waitStarted(3, "the replacement of a pod that died while warm")
}

// In a burst (a second run reserves while the first goes on), replacements
// start at once, so that the runs after them find warm pods too.
func TestPoolReplacesAtOnceInABurst(t *testing.T) {
	l := &fakeLauncher{}
	p := runningPool(t, l, 2)
	first := p.Reserve("team-a", "c1", "team-a/web")
	if p.Take("team-a", "team-a/web", first) == nil {
		t.Fatal("nothing to take")
	}
	if second := p.Reserve("team-a", "c1", "team-a/db"); second == "" {
		t.Fatal("the second run found no warm pod")
	}
	waitForStarts(t, l, 4, "both replacements while both runs go on")
}
