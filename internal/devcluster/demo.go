package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// Health is an object's kstatus-style state.
type Health string

const (
	// Current: Ready=True for the object's current generation, or an
	// object without conditions to wait for.
	Current Health = "Current"
	// InProgress: still being worked on.
	InProgress Health = "InProgress"
	// Failed: Stalled=True; the controller gave up until the spec changes.
	Failed Health = "Failed"
)

const terraceGroup = "terrace.dev"

// Evaluate reads an object's state as kstatus does (internal/readiness):
// objects of other groups with no conditions (Secrets, ConfigMaps) are
// Current at once; Terrace objects are Current only when Ready at their
// current generation.
func Evaluate(u *unstructured.Unstructured) (Health, string) {
	st, msg, err := readiness.Compute(u)
	switch {
	case err != nil:
		return InProgress, err.Error()
	case st == status.CurrentStatus:
		if ready, _, _ := readiness.ReadyAtGeneration(u); !ready {
			msg = "" // Current without a Ready condition: nothing to say
		}
		return Current, msg
	case st == status.FailedStatus:
		return Failed, "Stalled: " + msg
	default:
		return InProgress, msg
	}
}

// Outcome is how one applied object ended.
type Outcome struct {
	Applied
	Health  Health
	Message string
}

// WaitAll polls the objects until each is Current or Failed, or ctx ends;
// it reports every change of state through progress.
func WaitAll(ctx context.Context, cfg *rest.Config, objs []Applied, progress func(string)) ([]Outcome, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to create dynamic client: %w", err)
	}
	outcomes := make([]Outcome, len(objs))
	for i := range objs {
		outcomes[i] = Outcome{Applied: objs[i], Health: InProgress}
	}
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	for {
		pending := 0
		for i := range outcomes {
			o := &outcomes[i]
			if o.Health != InProgress {
				continue
			}
			ri := dyn.Resource(o.Resource).Namespace(o.Object.GetNamespace())
			current, err := ri.Get(ctx, o.Object.GetName(), metav1.GetOptions{})
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				o.Message = "failed to read: " + err.Error()
				pending++
				continue
			}
			o.Object = current
			health, msg := Evaluate(current)
			// An object without status (a Namespace, a Role, a Secret) is
			// Current as soon as it exists: "applied" said so already, and the
			// results list it, so the terminal gets no line for it here.
			quietlyCurrent := health == Current && msg == "" && o.Message == ""
			if (health != o.Health || msg != o.Message) && !quietlyCurrent {
				progress(fmt.Sprintf("%s: %s %s", o.Ref(), health, msg))
			}
			o.Health, o.Message = health, msg
			if health == InProgress {
				pending++
			}
		}
		if pending == 0 {
			return outcomes, nil
		}
		select {
		case <-ctx.Done():
			return outcomes, fmt.Errorf("%d object(s) not Ready in time: %w", pending, ctx.Err())
		case <-ticker.C:
		}
	}
}

// Report prints what each object produced: a Program's artifact, a Stack's
// outputs (values only where the latest release says they are not
// sensitive), its outputs Secret and its releases.
func Report(ctx context.Context, cfg *rest.Config, outcomes []Outcome, w io.Writer) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create clientset: %w", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("failed to create client: %w", err)
	}
	releases := secrets.New(c, secrets.Options{})
	for _, o := range outcomes {
		fmt.Fprintf(w, "%s: %s", o.Ref(), o.Health)
		if o.Message != "" {
			fmt.Fprintf(w, " (%s)", o.Message)
		}
		fmt.Fprintln(w)
		if o.Object.GroupVersionKind().Group != terraceGroup {
			continue
		}
		switch o.Object.GetKind() {
		case "Program":
			reportProgram(w, o.Object)
		case "Stack":
			if err := reportStack(ctx, w, cs, releases, o.Object); err != nil {
				fmt.Fprintf(w, "  (could not read results: %v)\n", err)
			}
		}
	}
	return nil
}

func reportProgram(w io.Writer, u *unstructured.Unstructured) {
	art, ok, _ := unstructured.NestedMap(u.Object, "status", "artifact")
	if !ok {
		fmt.Fprintln(w, "  no artifact advertised")
		return
	}
	fmt.Fprintf(w, "  artifact %v\n  digest   %v\n  revision %v\n", art["url"], art["digest"], art["revision"])
}

func reportStack(ctx context.Context, w io.Writer, cs kubernetes.Interface, releases release.Store, u *unstructured.Unstructured) error {
	names, _, _ := unstructured.NestedStringSlice(u.Object, "status", "outputs")
	if rev, ok, _ := unstructured.NestedString(u.Object, "status", "lastAppliedRevision"); ok {
		fmt.Fprintf(w, "  applied revision %s\n", rev)
	}
	fmt.Fprintf(w, "  outputs: %s\n", strings.Join(names, ", "))
	history, err := releases.ListReleases(ctx, u.GetNamespace(), u.GetName())
	if err != nil {
		return err
	}
	sensitive := map[string]bool{}
	known := map[string]bool{}
	for _, r := range history {
		fmt.Fprintf(w, "  release %d: %s (plan +%d ~%d -%d, source %s)\n", r.Revision, r.Status, r.Plan.Add, r.Plan.Change, r.Plan.Destroy, r.SourceRevision)
	}
	if n := len(history); n > 0 {
		for _, out := range history[n-1].Outputs {
			known[out.Name] = true
			sensitive[out.Name] = out.Sensitive
		}
	}
	secretName, ok, _ := unstructured.NestedString(u.Object, "spec", "writeOutputsToSecret", "name")
	if !ok {
		return nil
	}
	sec, err := cs.CoreV1().Secrets(u.GetNamespace()).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("failed to read outputs Secret %s: %w", secretName, err)
	}
	fmt.Fprintf(w, "  outputs Secret %s/%s:\n", u.GetNamespace(), secretName)
	for _, k := range sortedSecretKeys(sec) {
		switch {
		case !known[k]:
			fmt.Fprintf(w, "    %s: (not shown: no release says whether it is sensitive)\n", k)
		case sensitive[k]:
			fmt.Fprintf(w, "    %s: (sensitive)\n", k)
		default:
			fmt.Fprintf(w, "    %s = %s\n", k, printable(sec.Data[k]))
		}
	}
	return nil
}

func sortedSecretKeys(s *corev1.Secret) []string {
	keys := make([]string, 0, len(s.Data))
	for k := range s.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// printable shows a value as text, compacting JSON.
func printable(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) == nil {
		if out, err := json.Marshal(v); err == nil {
			return string(out)
		}
	}
	return string(b)
}
