package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/tf"
)

// paddedModule puts pad bytes into the state (the input, and again as the
// output known after apply).
const paddedModule = `
variable "pad" { type = number }
resource "terraform_data" "padded" {
  input = var.pad > 0 ? format("%0${var.pad}d", 0) : ""
}
`

func pad(n int) apiextensionsv1.JSON { return apiextensionsv1.JSON{Raw: []byte(strconv.Itoa(n))} }

// paddedStack makes a Stack of paddedModule with a small pad, applied
// automatically, and returns its state once Ready.
func (e *suiteEnv) paddedStack(name string) *state.State {
	e.t.Helper()
	e.stack(name, paddedModule, nil, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.Vars = map[string]apiextensionsv1.JSON{"pad": pad(10)}
	})
	e.waitFor(name, "Ready", readyAt)
	return e.currentState(name)
}

// Found 3 of docs/reliability.md: a state over the state server's limit
// was refused only when the apply saved it, after the resources changed,
// and the state recording them was lost. Now the plan is refused before
// it is applied (in one pass by the runner, kept for approval by the
// controller): Stalled with StateTooLarge, the stored state as it was,
// and Ready again once the input is put back.
func TestEnvtestOversizeStateIsRefusedAtPlanTime(t *testing.T) {
	for _, approve := range []string{terracev1.ApprovePlanAuto, ""} {
		t.Run("approvePlan="+approve, func(t *testing.T) {
			e := newSuiteEnv(t)
			before := e.paddedStack("big")

			e.update("big", func(st *terracev1.Stack) {
				st.Spec.ApprovePlan = approve
				st.Spec.Vars["pad"] = pad(suiteMaxStateBytes + 1024)
			})
			st := e.waitFor("big", "Stalled StateTooLarge", is(terracev1.StalledCondition, "True", StateTooLargeReason))
			msg := outcome.Get(st, terracev1.ReadyCondition).Message
			if !strings.Contains(msg, "was not applied") || !strings.Contains(msg, "--state-server-max-state-bytes") || st.Status.Failures != 0 {
				t.Fatalf("Ready message %q, failures %d: want the limit named, no retries", msg, st.Status.Failures)
			}
			if after := e.currentState("big"); after.Serial != before.Serial || after.Digest != before.Digest {
				t.Fatalf("the refused plan changed the state: serial %d → %d", before.Serial, after.Serial)
			}
			if st.Status.Plan != nil && st.Status.Plan.Pending != "" {
				t.Errorf("plan %s kept for approval: it could never be applied", st.Status.Plan.Pending)
			}
			if all := e.releases("big"); len(all) != 1 {
				t.Errorf("records %+v: a plan refused before applying changed nothing and has no release", all)
			}

			e.update("big", func(st *terracev1.Stack) {
				st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
				st.Spec.Vars["pad"] = pad(20)
			})
			e.waitFor("big", "Ready with the input put back", readyAt)
			for _, rel := range e.releases("big") {
				if rel.Status == release.StatusDeployed && rel.StateSerial != e.currentState("big").Serial {
					t.Errorf("deployed release %d names serial %d", rel.Revision, rel.StateSerial)
				}
			}
		})
	}
}

// A state larger than its planned values (a value known only after the
// apply doubles it) passes the plan-time check and is refused when tofu
// saves it, after the resources changed: terminal StateTooLarge, and the
// state tofu could not save is kept in the plan store, never lost.
func TestEnvtestStateRefusedAfterApplyIsKept(t *testing.T) {
	e := newSuiteEnv(t)
	before := e.paddedStack("big")

	// Input and output: twice the pad in the state, once in the plan.
	e.update("big", func(st *terracev1.Stack) { st.Spec.Vars["pad"] = pad(suiteMaxStateBytes * 2 / 3) })
	st := e.waitFor("big", "Stalled StateTooLarge", is(terracev1.StalledCondition, "True", StateTooLargeReason))
	msg := outcome.Get(st, terracev1.ReadyCondition).Message
	if !strings.Contains(msg, "kept in the Stack's plan store as errored-state-") {
		t.Fatalf("Ready message %q does not say where the state was kept", msg)
	}
	id := regexp.MustCompile(`errored-state-[a-z0-9-]+`).FindString(msg)
	if !strings.Contains(msg, "terrace push-state big "+id) {
		t.Errorf("Ready message %q does not say how to push the kept state", msg)
	}
	store, _ := suiteStores()
	kept, err := store.GetPlan(context.Background(), state.PlanKey{Namespace: e.ns, Stack: "big", ID: id})
	if err != nil {
		t.Fatalf("the refused state is not in the plan store as %s: %v", id, err)
	}
	var doc struct {
		Serial  int64  `json:"serial"`
		Lineage string `json:"lineage"`
	}
	if err := json.Unmarshal(kept.Binary, &doc); err != nil || doc.Serial <= before.Serial || doc.Lineage != before.Lineage || len(kept.Binary) <= suiteMaxStateBytes {
		t.Fatalf("kept %d bytes, serial %d lineage %q (%v); want the state the apply made, serial above %d, lineage %q",
			len(kept.Binary), doc.Serial, doc.Lineage, err, before.Serial, before.Lineage)
	}
	if after := e.currentState("big"); after.Serial != before.Serial {
		t.Errorf("the stored state moved from serial %d to %d", before.Serial, after.Serial)
	}
	if all := e.releases("big"); len(all) != 2 || all[1].Status != release.StatusFailed || !strings.Contains(all[1].Message, id) {
		t.Errorf("records %+v: want the apply recorded as failed, naming %s", all, id)
	}
}

// A refused state larger than the runner client's plan-file limit (32 MiB)
// is kept too, in parts the controller holds one at a time: before, it was
// downloaded whole under that limit and lost.
func TestEnvtestRefusedStateOverThePlanFileLimitIsKeptInParts(t *testing.T) {
	e := newSuiteEnv(t)
	store, _ := suiteStores()
	key := state.PlanKey{Namespace: e.ns, Stack: "big", ID: tf.ErroredStateID("plan-1")}
	var want bytes.Buffer
	want.WriteString(`{"version":4,"serial":2,"lineage":"l","resources":[{"pad":"`)
	for int64(want.Len()) < runner.DefaultLimits().PlanFileBytes+erroredStatePartBytes/2 {
		want.WriteString("0123456789abcdef")
	}
	want.WriteString(`"}]}`)
	parts := &planParts{ctx: context.Background(), store: store, key: key, size: erroredStatePartBytes}
	// As the runner client passes it on: in gRPC-sized writes.
	for rest := want.Bytes(); len(rest) > 0; {
		n := min(len(rest), 1<<20+7)
		if _, err := parts.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	if err := parts.Close(); err != nil {
		t.Fatal(err)
	}
	if len(parts.ids) != 3 || parts.ids[0] != key.ID || parts.ids[2] != key.ID+"-part-3" {
		t.Fatalf("kept as %v, want %s and two more parts", parts.ids, key.ID)
	}
	var got []byte
	for _, id := range parts.ids {
		p, err := store.GetPlan(context.Background(), state.PlanKey{Namespace: e.ns, Stack: "big", ID: id})
		if err != nil {
			t.Fatalf("part %s: %v", id, err)
		}
		if len(p.Binary) > erroredStatePartBytes {
			t.Fatalf("part %s holds %d bytes, over %d", id, len(p.Binary), erroredStatePartBytes)
		}
		got = append(got, p.Binary...)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("the parts joined are %d bytes, not the %d-byte state", len(got), want.Len())
	}
}
