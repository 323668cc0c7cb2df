package stack

import (
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/state"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// sizeHintStore is a state.Store that knows the last size of one state.
type sizeHintStore struct {
	state.Store
	size  int64
	known bool
}

func (s sizeHintStore) LastKnownSize(state.Key) (int64, bool) { return s.size, s.known }

// A plan goes in one tofu process only when the state cannot come near the
// state server's limit; otherwise it is planned first, so an oversize plan
// is refused before anything changes.
func TestOneProcessOnlyForStatesFarFromTheLimit(t *testing.T) {
	const limit = 64 << 20
	small := &runnerv1.Variables{Json: []byte(`{"n":1}`)}
	for _, tc := range []struct {
		name   string
		limit  int64
		store  sizeHintStore
		vars   *runnerv1.Variables
		own    bool
		expect bool
	}{
		{"small state, small inputs", limit, sizeHintStore{size: 10 << 10, known: true}, small, false, true},
		{"new state", limit, sizeHintStore{known: true}, small, false, true},
		{"size unknown", limit, sizeHintStore{}, small, false, false},
		{"state near the limit", limit, sizeHintStore{size: 40 << 20, known: true}, small, false, false},
		{"inputs near the limit", limit, sizeHintStore{known: true}, &runnerv1.Variables{Json: make([]byte, 9<<20)}, false, false},
		{"var files of unknown size", limit, sizeHintStore{known: true}, &runnerv1.Variables{Json: []byte(`{}`), Files: []string{"prod.tfvars"}}, false, false},
		{"a limit too small for headroom", 2 << 20, sizeHintStore{known: true}, small, false, false},
		{"no limit", 0, sizeHintStore{}, small, false, true},
		{"the Stack's own backend", limit, sizeHintStore{}, small, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{Options: Options{MaxStateBytes: tc.limit}}
			st := &terracev1.Stack{}
			st.Namespace, st.Name = "team", "web"
			if tc.own {
				st.Spec.Backend = &terracev1.StackBackend{Type: "s3"}
			}
			s := &scope{stack: st, run: &runScope{stores: &backend.Set{States: tc.store}}}
			if got := r.oneProcessFits(s, tc.vars); got != tc.expect {
				t.Errorf("oneProcessFits = %v, want %v", got, tc.expect)
			}
		})
	}
}
