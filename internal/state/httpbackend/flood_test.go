package httpbackend_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// stateStream is a state JSON of exactly size bytes, made as it is read, so
// the test's own uploads take no memory in the process being measured. Its
// padding hardly compresses: the store holds about as much as was sent.
type stateStream struct {
	head, tail []byte
	pad        int64
	off        int64
}

var incompressible = func() []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 64<<10) // longer than gzip's window
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return b
}()

func newStateStream(serial, size int64) *stateStream {
	head := fmt.Appendf(nil, `{"version":4,"serial":%d,"lineage":"flood","pad":"`, serial)
	tail := []byte(`"}`)
	return &stateStream{head: head, tail: tail, pad: size - int64(len(head)+len(tail))}
}

func (s *stateStream) size() int64 { return int64(len(s.head)) + s.pad + int64(len(s.tail)) }

func (s *stateStream) Read(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		var src []byte
		switch h := int64(len(s.head)); {
		case s.off < h:
			src = s.head[s.off:]
		case s.off < h+s.pad:
			i := s.off - h
			src = incompressible[i%int64(len(incompressible)):]
			src = src[:min(int64(len(src)), s.pad-i)]
		case s.off < s.size():
			src = s.tail[s.off-h-s.pad:]
		default:
			if total == 0 {
				return 0, io.EOF
			}
			return total, nil
		}
		n := copy(p[total:], src)
		total += n
		s.off += int64(n)
	}
	return total, nil
}

// heapSampler records the peak of the heap in use (live and not yet
// swept objects, and free space in spans in use: runtime.MemStats.HeapInuse).
type heapSampler struct {
	peak atomic.Uint64
	live atomic.Uint64 // the largest live heap a GC found
	stop chan struct{}
	done sync.WaitGroup
}

func heapInuse() uint64 {
	inuse, _ := readHeap()
	return inuse
}

func readHeap() (inuse, live uint64) {
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(samples)
	return samples[0].Value.Uint64() + samples[1].Value.Uint64(), samples[2].Value.Uint64()
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stop: make(chan struct{})}
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			inuse, live := readHeap()
			if inuse > h.peak.Load() {
				h.peak.Store(inuse)
			}
			if live > h.live.Load() {
				h.live.Store(live)
			}
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) finish() uint64 {
	close(h.stop)
	h.done.Wait()
	return h.peak.Load()
}

// upload POSTs a generated state of size bytes, announcing claimed bytes.
func upload(c *http.Client, url string, serial, size int64) (int, error) {
	body := newStateStream(serial, size)
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		return 0, err
	}
	req.ContentLength = body.size()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// download GETs a state and drops it, reporting the status.
func download(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// The attack: tenants flood the shared state server with oversized states
// and with many large-but-allowed uploads and downloads at once, to exhaust
// the controller's memory. The heap stays under a bound derived from the
// configured limits (the process runs with a memory limit, as the
// controller's Deployment sets GOMEMLIMIT), the floods are answered 413 and
// 503, and another namespace's ordinary requests keep succeeding.
func TestStateServerMemoryUnderFlood(t *testing.T) {
	opts := httpbackend.Options{
		MaxStateBytes:                8 << 20,
		MaxInflightBytes:             24 << 20,
		MaxInflightBytesPerNamespace: 16 << 20,
		AdmissionWait:                300 * time.Millisecond,
	}
	f := newFixture(t, opts)
	const workersPerNamespace, rounds = 12, 3
	attackers := []string{uniqueName("flood-a-"), uniqueName("flood-b-")}
	type worker struct {
		client *http.Client
		url    string
	}
	var workers []worker
	for _, ns := range attackers {
		for i := range workersPerNamespace {
			stack := fmt.Sprintf("s%d", i)
			f.runs.startRun(t, ns, stack, "run-1")
			workers = append(workers, worker{f.client(t, pki.RunnerIdentity(ns, stack, "run-1")), httpbackend.Address(f.baseURL, state.Key{Namespace: ns, Stack: stack, Workspace: "default"})})
		}
	}
	victimNS := uniqueName("victim-")
	f.runs.startRun(t, victimNS, "app", "run-1")
	victim := f.client(t, pki.RunnerIdentity(victimNS, "app", "run-1"))
	victimURL := httpbackend.Address(f.baseURL, state.Key{Namespace: victimNS, Stack: "app", Workspace: "default"})

	// The bound: every admitted byte held about four times over (body,
	// compressed, encoded for the store, garbage not yet collected) plus
	// room for the small requests and TLS buffers of ~30 connections.
	runtime.GC()
	baseline := heapInuse()
	bound := baseline + 4*uint64(opts.MaxInflightBytes) + 48<<20
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(int64(bound)))
	sampler := startHeapSampler()

	var mu sync.Mutex
	codes := map[string]map[int]int{"oversized": {}, "allowed": {}, "download": {}}
	record := func(kind string, code int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			code = -1 // the server hung up on an oversized body: also a refusal
		}
		codes[kind][code]++
	}
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				code, err := upload(w.client, w.url, int64(r+1), 64<<20)
				record("oversized", code, err)
				code, err = upload(w.client, w.url, int64(r+1), 7<<20+int64(i))
				record("allowed", code, err)
				code, err = download(w.client, w.url)
				record("download", code, err)
			}
		}()
	}
	flooding := make(chan struct{})
	go func() { wg.Wait(); close(flooding) }()

	// Meanwhile the victim namespace goes on with ordinary runs.
	var serial int64
	for done := false; !done; {
		select {
		case <-flooding:
			done = true
		default:
		}
		serial++
		lock := state.LockInfo{ID: fmt.Sprintf("victim-%d", serial)}
		steps := []struct {
			method string
			url    string
			body   []byte
		}{
			{http.MethodGet, victimURL, nil},
			{httpbackend.MethodLock, victimURL, lockBody(t, lock)},
			{http.MethodPost, victimURL + "?ID=" + lock.ID, storetest.StateJSON("victim", serial, 0, 20<<10)},
			{httpbackend.MethodUnlock, victimURL, lockBody(t, lock)},
		}
		for _, s := range steps {
			if r := do(t, victim, s.method, s.url, s.body); r.code != http.StatusOK && r.code != http.StatusNoContent {
				t.Fatalf("victim's %s during the flood: %d %s", s.method, r.code, r.body)
			}
		}
	}
	peak := sampler.finish()
	t.Logf("heap in use: baseline %d MiB, peak %d MiB (live after a GC at most %d MiB), bound %d MiB; victim made %d runs; answers %v",
		baseline>>20, peak>>20, sampler.live.Load()>>20, bound>>20, serial, codes)

	if peak > bound {
		t.Fatalf("heap in use peaked at %d MiB, over the bound of %d MiB derived from the limits", peak>>20, bound>>20)
	}
	if n := codes["oversized"][http.StatusOK]; n > 0 {
		t.Fatalf("%d oversized states were stored", n)
	}
	if codes["oversized"][http.StatusRequestEntityTooLarge]+codes["oversized"][-1] != len(workers)*rounds {
		t.Fatalf("oversized uploads were not all refused: %v", codes["oversized"])
	}
	// The flood was real: some allowed uploads went through, some were turned away.
	if codes["allowed"][http.StatusOK] == 0 || codes["allowed"][http.StatusServiceUnavailable]+codes["download"][http.StatusServiceUnavailable] == 0 {
		t.Fatalf("allowed uploads %v, downloads %v: want some stored and some answered 503", codes["allowed"], codes["download"])
	}
	if serial < 2 {
		t.Fatalf("the victim completed %d runs during the flood", serial)
	}
	// What was stored is whole.
	for _, w := range workers[:1] {
		if r := do(t, w.client, http.MethodGet, w.url, nil); r.code == http.StatusOK && int64(len(r.body)) < 7<<20 {
			t.Fatalf("a stored state came back with %d bytes", len(r.body))
		}
	}
}

// The attack: a client is admitted for a large upload, then trickles its
// body to hold the budget of bytes in flight. It is cut off at its
// transfer deadline, and another namespace's large upload, waiting for
// room, goes through.
func TestTrickledUploadLosesItsAdmission(t *testing.T) {
	f := newFixture(t, httpbackend.Options{MaxInflightBytes: 3 << 20, MaxInflightBytesPerNamespace: 3 << 20, AdmissionWait: time.Minute})
	slowNS, otherNS := uniqueName("trickle-"), uniqueName("other-")
	f.runs.startRun(t, slowNS, "app", "run-1")
	f.runs.startRun(t, otherNS, "app", "run-1")
	slowURL := httpbackend.Address(f.baseURL, state.Key{Namespace: slowNS, Stack: "app", Workspace: "default"})
	otherURL := httpbackend.Address(f.baseURL, state.Key{Namespace: otherNS, Stack: "app", Workspace: "default"})

	// The trickler sends 1 KiB of a 2 MiB state, then nothing.
	stalled := make(chan struct{})
	body, writer := io.Pipe()
	trickle := make(chan error, 1)
	trickler := f.client(t, pki.RunnerIdentity(slowNS, "app", "run-1"))
	go func() {
		req, _ := http.NewRequest(http.MethodPost, slowURL, body)
		req.ContentLength = 2 << 20
		resp, err := trickler.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		trickle <- err
	}()
	go func() {
		_, _ = writer.Write(make([]byte, 1<<10))
		close(stalled)
	}()
	<-stalled
	// Once the trickler is admitted, the other namespace's 2 MiB state
	// does not fit until the trickler's deadline passes.
	waitInflight(t, 2<<20)
	code, err := upload(f.client(t, pki.RunnerIdentity(otherNS, "app", "run-1")), otherURL, 1, 2<<20)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the other namespace's upload while a client trickled: %d %v", code, err)
	}
	_ = writer.Close()
	if err := <-trickle; err == nil {
		t.Fatal("the trickled upload was stored")
	}
	if st, err := f.store.Get(t.Context(), state.Key{Namespace: slowNS, Stack: "app", Workspace: "default"}); err == nil {
		t.Fatalf("the trickled upload left a state: serial %d", st.Serial)
	}
}

// waitInflight waits until the state server has admitted n bytes.
func waitInflight(t *testing.T, n float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		families, err := ctrlmetrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range families {
			if mf.GetName() == "terrace_state_inflight_bytes" && mf.GetMetric()[0].GetGauge().GetValue() >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the state server never admitted %.0f bytes", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
