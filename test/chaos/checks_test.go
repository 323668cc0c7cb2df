package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// endCheck is what the end of the test found for one workload.
type endCheck struct {
	ready        error
	lostState    []string
	stuckLock    string
	leakedPods   []string
	leakedSecret []string
	releases     []string
	files        []string
}

func (c *endCheck) problems() []string {
	var out []string
	if c.ready != nil {
		out = append(out, "not Ready: "+c.ready.Error())
	}
	out = append(out, c.lostState...)
	if c.stuckLock != "" {
		out = append(out, "lock held: "+c.stuckLock)
	}
	for _, p := range c.leakedPods {
		out = append(out, "runner pod left: "+p)
	}
	for _, s := range c.leakedSecret {
		out = append(out, "per-run Secret left: "+s)
	}
	out = append(out, c.releases...)
	out = append(out, c.files...)
	return out
}

// check verifies the workload at the end: Ready at its latest generation,
// its state intact and holding what the inputs ask for, the same files on
// disk, no lock, no runner pod or per-run Secret, release records that agree
// with the state.
func (w *workload) check(ctx context.Context) *endCheck {
	c := &endCheck{}
	c.ready = w.waitReady(ctx, recoveryTimeout)
	w.stopWatching()
	w.observeState(ctx)
	w.mu.Lock()
	c.lostState = append(c.lostState, w.stateErrors...)
	generation := w.generation
	w.mu.Unlock()

	stateStore, releaseStore, closeStore, err := w.store(ctx)
	if err != nil {
		c.lostState = append(c.lostState, "cannot open the store: "+err.Error())
		return c
	}
	defer closeStore()
	st, err := stateStore.Get(ctx, w.key())
	if err != nil {
		c.lostState = append(c.lostState, "no state: "+err.Error())
		return c
	}
	contents, err := fileContents(st.Data)
	if err != nil {
		c.lostState = append(c.lostState, err.Error())
	}
	want := map[string]string{}
	for i := range w.files {
		want[filepath.Join(w.dir, fmt.Sprintf("file-%d.txt", i))] = fmt.Sprintf("generation %d", generation)
	}
	if !equalMaps(contents, want) {
		c.lostState = append(c.lostState, fmt.Sprintf("state holds files %v, the inputs ask for %v", contents, want))
	}
	onDisk := w.filesOnDisk()
	if !equalMaps(onDisk, want) {
		c.files = append(c.files, fmt.Sprintf("files on disk %v, the inputs ask for %v", onDisk, want))
	}

	if lock, err := stateStore.GetLock(ctx, w.key()); err != nil {
		c.stuckLock = "cannot read: " + err.Error()
	} else if lock != nil {
		c.stuckLock = fmt.Sprintf("%s held by %s since %s", lock.ID, lock.Who, lock.Created)
	}

	// Cleanup runs after Ready: a leak is what is still there a minute on.
	_ = poll(ctx, time.Minute, func() error {
		c.leakedPods, c.leakedSecret = nil, nil
		pods, err := w.runnerPods(ctx)
		if err != nil {
			return err
		}
		for _, p := range pods {
			c.leakedPods = append(c.leakedPods, p.Name+" ("+string(p.Status.Phase)+")")
		}
		var secrets corev1.SecretList
		if err := w.e.c.List(ctx, &secrets, client.InNamespace(w.ns), client.MatchingLabels{launcher.LabelComponent: launcher.ComponentRunnerTLS}); err != nil {
			return err
		}
		for _, s := range secrets.Items {
			c.leakedSecret = append(c.leakedSecret, s.Name)
		}
		if len(c.leakedPods)+len(c.leakedSecret) > 0 {
			return fmt.Errorf("leaks")
		}
		return nil
	})

	stack, err := w.get(ctx)
	if err != nil {
		c.releases = append(c.releases, err.Error())
		return c
	}
	records, err := releaseStore.ListReleases(ctx, w.ns, w.name)
	if err != nil {
		c.releases = append(c.releases, "cannot list releases: "+err.Error())
		return c
	}
	c.releases = append(c.releases, releasesAgree(records, stack.Status.Release, st.Serial, st.CreatedAt)...)
	return c
}

// releasesAgree checks the records against the state: one deployed record,
// the newest that did not fail, the one the Stack's status names, and the
// one that left the state's serial; serials that never go back from one
// record to the next; no state written after the deployed record finished.
// (An apply that changes resources need not raise the serial: a drift
// repaired puts back what the state records, and tofu writes no new
// state. Counting changing applies against serials was wrong.)
func releasesAgree(records []release.Release, status *terracev1.ReleaseStatus, serial int64, stateAt time.Time) []string {
	var out []string
	if len(records) == 0 {
		return []string{"no release record"}
	}
	var deployed []release.Release
	newestOK := 0
	var lastSerial int64
	for _, r := range records {
		if r.Status == release.StatusDeployed {
			deployed = append(deployed, r)
		}
		if r.Status != release.StatusFailed && r.Revision > newestOK {
			newestOK = r.Revision
		}
		if r.StateSerial > 0 && r.StateSerial < lastSerial {
			out = append(out, fmt.Sprintf("release %d records state serial %d, an earlier one %d", r.Revision, r.StateSerial, lastSerial))
		}
		lastSerial = max(lastSerial, r.StateSerial)
	}
	if len(deployed) != 1 {
		return append(out, fmt.Sprintf("%d deployed release records", len(deployed)))
	}
	d := deployed[0]
	if d.Revision != newestOK {
		out = append(out, fmt.Sprintf("release %d is deployed, but %d is newer and did not fail", d.Revision, newestOK))
	}
	if status == nil || status.Revision != int64(d.Revision) {
		out = append(out, fmt.Sprintf("the Stack's status names release %+v, the deployed record is %d", status, d.Revision))
	}
	if d.StateSerial != serial {
		out = append(out, fmt.Sprintf("deployed release %d left state serial %d, the state's serial is %d", d.Revision, d.StateSerial, serial))
	}
	if stateAt.After(d.FinishedAt.Add(time.Second)) {
		out = append(out, fmt.Sprintf("the state was written at %s, after deployed release %d finished at %s", stateAt.Format(time.RFC3339Nano), d.Revision, d.FinishedAt.Format(time.RFC3339Nano)))
	}
	return out
}

// filesOnDisk reads the workload's directory: path → content.
func (w *workload) filesOnDisk() map[string]string {
	onDisk := map[string]string{}
	entries, _ := os.ReadDir(w.dir)
	for _, ent := range entries {
		b, err := os.ReadFile(filepath.Join(w.dir, ent.Name()))
		if err == nil {
			onDisk[filepath.Join(w.dir, ent.Name())] = string(b)
		}
	}
	return onDisk
}

// fileContents reads testfile_file instances (path → content) from a state.
func fileContents(data []byte) (map[string]string, error) {
	var doc struct {
		Resources []struct {
			Type      string `json:"type"`
			Instances []struct {
				Attributes struct {
					Path    string `json:"path"`
					Content string `json:"content"`
				} `json:"attributes"`
			} `json:"instances"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("the state is not JSON: %v", err)
	}
	out := map[string]string{}
	for _, r := range doc.Resources {
		if r.Type != "testfile_file" {
			continue
		}
		for _, in := range r.Instances {
			out[in.Attributes.Path] = in.Attributes.Content
		}
	}
	return out, nil
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// logMarks are log sizes at one moment, to read what came after.
type logMarks map[string]int64

// logFiles are the controllers' logs and every runner container's log.
func (e *env) logFiles() []string {
	var files []string
	for _, r := range e.ctrls.replicas {
		files = append(files, r.logPath)
	}
	_ = filepath.WalkDir(e.podLogDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") {
			files = append(files, p)
		}
		return nil
	})
	return files
}

func (e *env) markLogs() logMarks {
	m := logMarks{}
	for _, f := range e.logFiles() {
		if info, err := os.Stat(f); err == nil {
			m[f] = info.Size()
		}
	}
	return m
}

var (
	handshakeLine = regexp.MustCompile(`(?i)tls handshake|handshake fail|x509:|certificate signed by unknown authority|bad certificate|tls: `)
	// interruptedLine is a handshake cut short by a killed process or a
	// closed connection: the injected faults cause those.
	// A handshake timeout is a server too busy or restarting to answer
	// (kube-apiserver while it restarts), not a certificate refused.
	interruptedLine = regexp.MustCompile(`(?i)EOF|connection reset|broken pipe|use of closed network connection|i/o timeout|handshake timeout|context canceled|connection refused`)
	// plaintextLine is a client that sent plain HTTP, no handshake at all:
	// no Terrace client does (every URL the controllers hand out is
	// https). Seen once in a smoke run for two minutes from the first
	// second of a replica, every few seconds from new ports: another
	// process on the shared machine polling a port the replica got.
	plaintextLine = regexp.MustCompile(`client sent an HTTP request to an HTTPS server`)
)

// handshakes returns the handshake failures logged between from and to
// (nil: now), and how many were cut short by a dead peer.
func (e *env) handshakes(from, to logMarks) (failures []string, interrupted int) {
	for _, f := range e.logFiles() {
		info, err := os.Stat(f)
		if err != nil {
			continue
		}
		start, end := from[f], info.Size()
		if v, ok := to[f]; ok && to != nil {
			end = v
		}
		if start >= end {
			continue
		}
		window, err := readRange(f, start, end)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(window, "\n") {
			// A cheap test first: the logs are tens of megabytes.
			if !strings.Contains(line, "andshake") && !strings.Contains(line, "x509") && !strings.Contains(line, "tls:") && !strings.Contains(line, "ertificate") {
				continue
			}
			if !handshakeLine.MatchString(line) || plaintextLine.MatchString(line) {
				continue
			}
			if interruptedLine.MatchString(line) {
				interrupted++
				continue
			}
			failures = append(failures, filepath.Base(filepath.Dir(filepath.Dir(f)))+"/"+filepath.Base(f)+": "+strings.TrimSpace(line))
		}
	}
	sort.Strings(failures)
	return failures, interrupted
}

// readRange reads bytes [start, end) of a file.
func readRange(path string, start, end int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, end-start)
	n, err := f.ReadAt(b, start)
	if err != nil && n == 0 {
		return "", err
	}
	return string(b[:n]), nil
}

// row is one line of the results table.
type row struct {
	fault                                      string
	injected, affected, recovered, lost, locks int
	leaks, handshakes, releases                int
	worst                                      time.Duration
	missed                                     int
}

// table summarises results by fault, in faultOrder.
func (r *results) table() []row {
	rows := map[string]*row{}
	get := func(f string) *row {
		if rows[f] == nil {
			rows[f] = &row{fault: f}
		}
		return rows[f]
	}
	for _, in := range r.injections {
		x := get(in.fault)
		x.injected++
		x.affected += in.affected
		if in.recovered && r.checks[in.workload] != nil && r.checks[in.workload].ready == nil {
			x.recovered += in.affected
		}
		if in.recovery > x.worst {
			x.worst = in.recovery
		}
	}
	for w, c := range r.checks {
		f, ok := r.workloadFault[w]
		if !ok {
			f = faultCARotation
		}
		x := get(f)
		if len(c.lostState) > 0 {
			x.lost++
		}
		if c.stuckLock != "" {
			x.locks++
		}
		x.leaks += len(c.leakedPods) + len(c.leakedSecret)
		if len(c.releases) > 0 {
			x.releases++
		}
	}
	if r.rotations > 0 {
		x := get(faultCARotation)
		x.injected = r.rotations
		x.affected = r.rotationRuns
		x.recovered = r.rotationRecovered
		x.worst = r.rotationWorst
	}
	for f, lines := range r.handshakeByFault {
		get(f).handshakes = len(lines)
	}
	for f, n := range r.missed {
		get(f).missed = n
	}
	var out []row
	for _, f := range faultOrder {
		if x := rows[f]; x != nil {
			out = append(out, *x)
		}
	}
	return out
}

// markdown renders the table as docs/reliability.md shows it.
func markdown(rows []row) string {
	var b strings.Builder
	b.WriteString("| fault | times injected | runs affected | recovered | lost states | stuck locks | leaked pods/Secrets | handshake failures | release records off | worst time to recover |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range rows {
		worst := "–"
		if x.worst > 0 {
			worst = fmt.Sprintf("%.1f s", x.worst.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %s |\n",
			x.fault, x.injected, x.affected, x.recovered, x.lost, x.locks, x.leaks, x.handshakes, x.releases, worst)
	}
	return b.String()
}
