package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// restWatchEvent is one line of GET /v1/installations/{name}/watch.
type restWatchEvent struct {
	Installation struct {
		Name  string `json:"name"`
		Phase string `json:"phase"`
		Ready bool   `json:"ready"`
	} `json:"installation"`
	Deleted *bool `json:"deleted"`
}

// TestRESTWatchStreamsLines: the REST route of Watch answers
// newline-delimited JSON through the transcoder, one line per status change,
// each sent as it happens (the next change is made only after the line of
// the last one was read), and ends after the deletion. Errors are the REST
// API's JSON errors, before any line.
func TestRESTWatchStreamsLines(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations",
		map[string]any{"name": "web", "source": map[string]string{"programRef": "m"}}, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lines := at.restWatch(ctx, "web")
	next := func(want string) restWatchEvent {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("the stream ended waiting for %s: %v", want, lines.Err())
		}
		var ev restWatchEvent
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", lines.Text(), err)
		}
		// Every field is written, as in every REST answer.
		if ev.Deleted == nil || ev.Installation.Name != "web" || ev.Installation.Phase != want {
			t.Fatalf("line %s, want phase %s", lines.Text(), want)
		}
		return ev
	}
	at.planAndApply("web", func(phase string) {
		if ev := next(phase); phase == phaseReady && !ev.Installation.Ready {
			t.Fatalf("ready: %+v", ev)
		}
	})
	at.expect(http.StatusAccepted, at.admin, http.MethodDelete, "/v1/installations/web", nil, nil)
	deleted := false
	for !deleted && lines.Scan() {
		var ev restWatchEvent
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil || ev.Installation.Phase != phaseDeleting {
			t.Fatalf("after delete: %s (%v)", lines.Text(), err)
		}
		deleted = ev.Deleted != nil && *ev.Deleted
	}
	if !deleted {
		t.Fatalf("no deleted line: %v", lines.Err())
	}
	if lines.Scan() {
		t.Fatalf("the stream goes on after the deletion: %s", lines.Text())
	}

	// Refusals, as the REST API writes them.
	at.expectError(http.StatusUnauthorized, "", http.MethodGet, "/v1/installations/web/watch", nil)
	at.expectError(http.StatusForbidden, at.nobody, http.MethodGet, "/v1/installations/web/watch", nil, `cannot get resource "stacks"`)
	at.expectError(http.StatusNotFound, at.admin, http.MethodGet, "/v1/installations/gone/watch", nil, "gone")
	at.expectError(http.StatusBadRequest, at.admin, http.MethodGet, "/v1/installations/web/watch?cluster=nowhere", nil, "cluster nowhere is not known")
	at.expectError(http.StatusBadRequest, at.admin, http.MethodGet, "/v1/installations/web/watch?since=1", nil, `unknown query parameter "since"`)
}

// restWatch starts the REST watch of installation name as the installer
// and returns its lines; the response is closed when the test ends.
func (at *apiTest) restWatch(ctx context.Context, name string) *bufio.Scanner {
	at.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, at.url+"/v1/installations/"+name+"/watch", nil)
	if err != nil {
		at.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+at.admin)
	// No client timeout: the stream stays open until the deletion.
	resp, err := (&http.Client{Transport: at.http.Transport}).Do(req)
	if err != nil {
		at.t.Fatal(err)
	}
	at.t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), ndjson) {
		at.t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return bufio.NewScanner(resp.Body)
}

// TestRESTWatchEndsWithAnErrorLine: an error once lines were sent (here
// the Stack stops being an installation) cannot change the status any
// more, so it is the stream's last line, in the REST API's error shape.
func TestRESTWatchEndsWithAnErrorLine(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations",
		map[string]any{"name": "web", "source": map[string]string{"programRef": "m"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lines := at.restWatch(ctx, "web")
	if !lines.Scan() {
		t.Fatalf("no first line: %v", lines.Err())
	}
	stack := at.stack("web")
	delete(stack.Labels, InstallationLabel)
	if err := env.Client.Update(ctx, stack); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() {
		t.Fatalf("no error line: %v", lines.Err())
	}
	var last struct {
		Error *legacyError `json:"error"`
	}
	if err := json.Unmarshal(lines.Bytes(), &last); err != nil || last.Error == nil ||
		last.Error.Code != http.StatusNotFound || last.Error.Reason != reasonNotAnInstallation || !strings.Contains(last.Error.Message, "no longer an installation") {
		t.Fatalf("last line %s (%v)", lines.Text(), err)
	}
	if lines.Scan() {
		t.Fatalf("a line after the error: %s", lines.Text())
	}
}
