package httpbackend_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// Environment of the attacker process TestHeaderOnlyUploads starts.
const (
	attackDirEnv = "TERRACE_TEST_UPLOAD_ATTACK_DIR"
	attackURLEnv = "TERRACE_TEST_UPLOAD_ATTACK_URLS"
	attackNEnv   = "TERRACE_TEST_UPLOAD_ATTACK_N"
)

// headerOnlyUploads is the attack's size: module code with its run's
// certificate opens this many uploads that announce a small state and
// send only their headers.
const headerOnlyUploads = 2000

// attackReport is what the attacker process prints when it is done.
type attackReport struct {
	// Codes counts the answers by status; -1 counts connections closed
	// without an answer, -2 connections that could not be made.
	Codes map[int]int
	// Unanswered counts requests still waiting when the attacker gave up.
	Unanswered int
	// Sample is one answer's body per status, for the log.
	Sample map[int]string
}

// The attack: module code, with its own run's certificates (four Stacks
// of one namespace), opens 2,000 uploads that each announce a state of
// 1 MiB, the most that skipped admission, and then send nothing. The state
// server runs in this process, the attacker in another, so the heap
// measured is the server's alone. The server's heap stays under a bound
// that does not grow with the number of uploads, every upload gets an
// HTTP answer that says why (429 over the connection caps, 408 when its
// body did not come in time), and meanwhile a run of another namespace
// reads, locks, writes and unlocks its state.
func TestHeaderOnlyUploads(t *testing.T) {
	// The server's defaults, but for a shorter wait for the bodies.
	opts := httpbackend.Options{BodyTimeout: 3 * time.Second}
	f := newFixture(t, opts)
	attackerNS := uniqueName("uploads-")
	dir := t.TempDir()
	var urls []string
	for i := range 4 {
		stack := fmt.Sprintf("s%d", i)
		f.runs.startRun(t, attackerNS, stack, "run-1")
		leaf := f.leaf(t, pki.RunnerIdentity(attackerNS, stack, "run-1"))
		for name, data := range map[string][]byte{"cert": leaf.CertPEM, "key": leaf.KeyPEM, "ca": leaf.CABundlePEM} {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.pem", name, i)), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		urls = append(urls, httpbackend.Address(f.baseURL, state.Key{Namespace: attackerNS, Stack: stack, Workspace: "default"}))
	}
	victimNS := uniqueName("victim-")
	f.runs.startRun(t, victimNS, "app", "run-1")
	// The victim's tofu connects while the flood is under way.
	victim := f.client(t, pki.RunnerIdentity(victimNS, "app", "run-1"))
	victimURL := httpbackend.Address(f.baseURL, state.Key{Namespace: victimNS, Stack: "app", Workspace: "default"})

	runtime.GC()
	baseline := heapInuse()
	sampler := startHeapSampler()

	// The test binary again: TestMain runs uploadAttacker when it finds
	// attackDirEnv.
	attacker := exec.Command(os.Args[0])
	attacker.Env = append(os.Environ(), attackDirEnv+"="+dir, attackURLEnv+"="+strings.Join(urls, " "),
		attackNEnv+"="+strconv.Itoa(headerOnlyUploads), pgtest.EnvURL+"="+dbURL)
	stdout, err := attacker.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	attacker.Stderr = os.Stderr
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = attacker.Process.Kill() })
	lines := bufio.NewScanner(stdout)
	var report *attackReport
	waitFor := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				return rest
			}
		}
		t.Fatalf("the attacker ended before it printed %q: %v", prefix, lines.Err())
		return ""
	}
	sent, _ := strconv.Atoi(waitFor("ATTACK SENT "))

	// While the uploads are held, another namespace's run goes on.
	start := time.Now()
	lock := state.LockInfo{ID: "victim-lock"}
	for _, s := range []struct {
		method, url string
		body        []byte
	}{
		{http.MethodGet, victimURL, nil},
		{httpbackend.MethodLock, victimURL, lockBody(t, lock)},
		{http.MethodPost, victimURL + "?ID=" + lock.ID, storetest.StateJSON("victim", 1, 0, 20<<10)},
		{httpbackend.MethodUnlock, victimURL, lockBody(t, lock)},
	} {
		if r := do(t, victim, s.method, s.url, s.body); r.code != http.StatusOK && r.code != http.StatusNoContent {
			t.Fatalf("victim's %s during the attack: %d %s", s.method, r.code, r.body)
		}
	}
	victimTook := time.Since(start)

	raw := waitFor("ATTACK REPORT ")
	report = &attackReport{}
	if err := json.Unmarshal([]byte(raw), report); err != nil {
		t.Fatal(err)
	}
	_ = attacker.Wait()
	peak := sampler.finish()
	// What the server may hold does not depend on the number of uploads:
	// at most MaxConnections connections (each some 30-50 KiB of TLS and
	// HTTP buffers), and bodies only as their bytes arrive.
	bound := baseline + uint64(httpbackend.DefaultOptions().MaxConnections)*64<<10
	t.Logf("%d header-only uploads (%d sent their headers before the victim's run): server heap in use baseline %d MiB, peak %d MiB (live after a GC at most %d MiB), bound %d MiB; the victim's run took %s; answers %v, unanswered %d",
		headerOnlyUploads, sent, baseline>>20, peak>>20, sampler.live.Load()>>20, bound>>20, victimTook.Round(time.Millisecond), report.Codes, report.Unanswered)
	for code, body := range report.Sample {
		t.Logf("answer %d: %s", code, body)
	}
	if peak > bound {
		t.Errorf("the server's heap peaked at %d MiB, over %d MiB: %d MiB above its baseline for uploads that sent no body", peak>>20, bound>>20, (peak-baseline)>>20)
	}
	if report.Unanswered > 0 || report.Codes[-1] > 0 || report.Codes[-2] > 0 {
		t.Errorf("%d uploads were never answered, %d connections closed without an answer, %d could not connect: every upload must get an HTTP status that says why", report.Unanswered, report.Codes[-1], report.Codes[-2])
	}
	for code, n := range report.Codes {
		if code != http.StatusTooManyRequests && code != http.StatusRequestTimeout {
			t.Errorf("%d uploads were answered %d, want 429 (over a connection cap) or 408 (no body in time)", n, code)
		}
	}
}

// uploadAttacker is the attacker process of TestHeaderOnlyUploads (the
// test binary started with attackDirEnv, which TestMain hands here): it
// prints "ATTACK SENT n" once half its uploads are under way, then "ATTACK
// REPORT {json}", and returns the process's exit code.
func uploadAttacker(dir string) int {
	urls := strings.Fields(os.Getenv(attackURLEnv))
	n, _ := strconv.Atoi(os.Getenv(attackNEnv))
	configs := make([]*tls.Config, len(urls))
	for i := range urls {
		read := func(name string) []byte {
			data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s-%d.pem", name, i)))
			if err != nil {
				fmt.Fprintln(os.Stderr, "attacker:", err)
				os.Exit(1)
			}
			return data
		}
		cert, err := tls.X509KeyPair(read("cert"), read("key"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "attacker:", err)
			return 1
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(read("ca"))
		configs[i] = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	}

	var mu sync.Mutex
	report := attackReport{Codes: map[int]int{}, Sample: map[int]string{}}
	answered := func(code int, body string) {
		mu.Lock()
		defer mu.Unlock()
		report.Codes[code]++
		if _, ok := report.Sample[code]; !ok {
			report.Sample[code] = body
		}
	}
	var done sync.WaitGroup
	sentCount := 0
	done.Add(n)
	giveUp := time.Now().Add(2 * time.Minute)
	for i := range n {
		target := urls[i%len(urls)]
		cfg := configs[i%len(urls)]
		go func() {
			defer done.Done()
			u, _ := url.Parse(target)
			attempted := sync.OnceFunc(func() {
				mu.Lock()
				sentCount++
				mu.Unlock()
			})
			defer attempted()
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Minute}, "tcp", u.Host, cfg)
			if err != nil {
				answered(-2, err.Error())
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(giveUp)
			// The headers of a 1 MiB state, and not one byte of it.
			if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", u.RequestURI(), u.Host, 1<<20); err != nil {
				answered(-1, err.Error())
				return
			}
			attempted()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					mu.Lock()
					report.Unanswered++
					mu.Unlock()
					return
				}
				answered(-1, err.Error())
				return
			}
			body := make([]byte, 512)
			m, _ := resp.Body.Read(body)
			answered(resp.StatusCode, strings.TrimSpace(string(body[:m])))
		}()
	}
	// The victim's run starts once half the uploads are under way.
	var half sync.WaitGroup
	half.Add(1)
	go func() {
		for {
			mu.Lock()
			k := sentCount
			mu.Unlock()
			if k >= n/2 {
				fmt.Printf("ATTACK SENT %d\n", k)
				half.Done()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	half.Wait()
	done.Wait()
	out, _ := json.Marshal(report)
	fmt.Printf("ATTACK REPORT %s\n", out)
	return 0
}
