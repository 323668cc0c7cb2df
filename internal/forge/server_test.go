package forge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeForge is an httptest server answering what a test routes, and
// keeping the comments a forge would keep.
type fakeForge struct {
	t      *testing.T
	server *httptest.Server
	mux    *http.ServeMux

	mu       sync.Mutex
	requests []string // "METHOD escaped-path?query"
	comments []map[string]any
	nextID   int64
}

func newFakeForge(t *testing.T) *fakeForge {
	t.Helper()
	f := &fakeForge{t: t, mux: http.NewServeMux(), nextID: 1000}
	f.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.RequestURI())
		f.mu.Unlock()
		f.mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.server.Close)
	return f
}

func (f *fakeForge) handle(pattern string, h http.HandlerFunc) { f.mux.HandleFunc(pattern, h) }

// file serves a testdata file with a status.
func (f *fakeForge) file(pattern, name string, status int) {
	body := testdata(f.t, name)
	f.handle(pattern, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
	})
}

func (f *fakeForge) requestLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func (f *fakeForge) count(prefix string) int {
	n := 0
	for _, r := range f.requestLog() {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

// seedComments loads a testdata list of comments as the forge's own.
func (f *fakeForge) seedComments(name string) {
	if err := json.Unmarshal(testdata(f.t, name), &f.comments); err != nil {
		f.t.Fatal(err)
	}
}

// commentStore serves list, create and edit of comments; author is the
// user JSON that a created comment gets, bodyKey the body's field name,
// authorKey the author's.
func (f *fakeForge) commentStore(list, create, edit string, authorKey string, author map[string]any) {
	f.handle(list, func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		json.NewEncoder(w).Encode(f.comments)
	})
	f.handle(create, func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		json.NewDecoder(r.Body).Decode(&in)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.nextID++
		c := map[string]any{"id": f.nextID, "body": in["body"], authorKey: author}
		f.comments = append(f.comments, c)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(c)
	})
	f.handle(edit, func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		json.NewDecoder(r.Body).Decode(&in)
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.comments {
			if n, _ := c["id"].(float64); int64(n) == id {
				c["body"] = in["body"]
				json.NewEncoder(w).Encode(c)
				return
			}
			if n, _ := c["id"].(int64); n == id {
				c["body"] = in["body"]
				json.NewEncoder(w).Encode(c)
				return
			}
		}
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	})
}

func (f *fakeForge) commentBodies() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.comments {
		out = append(out, fmt.Sprint(c["body"]))
	}
	return out
}

func testdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
