package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// Condition reasons about inputs.
const (
	VarsNotFoundReason = "VarsNotFound"
	InvalidVarsReason  = "InvalidVars"
)

// inputs are the variables of a run and a digest of everything that decides
// what a plan does.
type inputs struct {
	vars map[string]json.RawMessage
	// sensitive names the variables that came from Secrets: their values
	// are redacted by the runner and never written to status or events.
	sensitive []string
	// secretVersions stand for the values of variables from Secrets in
	// the digest (status is readable by more people than Secrets).
	secretVersions map[string]string
	// digest is the desired-state digest (desiredDigest): a change means
	// a new plan is due.
	digest string
}

// gatherInputs merges spec.vars and spec.varsFrom (later entries win).
func (r *Reconciler) gatherInputs(ctx context.Context, s *scope) error {
	vars := map[string]json.RawMessage{}
	fromSecret := map[string]bool{}
	// Secret values are not hashed into the digest (status is readable by
	// more people than Secrets): a Secret's resourceVersion stands for them.
	secretVersions := map[string]string{}
	for name, v := range s.stack.Spec.Vars {
		vars[name] = json.RawMessage(v.Raw)
	}
	for i, ref := range s.stack.Spec.VarsFrom {
		data, version, err := r.readVarsObject(ctx, s, i, ref)
		if isTerminalOrWaiting(err) {
			return err
		}
		if apierrors.IsNotFound(err) {
			if ref.Optional {
				continue
			}
			return outcome.Terminalf(VarsNotFoundReason, "spec.varsFrom[%d]: %s %s/%s not found: create it or mark the entry optional", i, ref.Kind, s.stack.Namespace, ref.Name)
		}
		if err != nil {
			return fmt.Errorf("failed to read spec.varsFrom[%d] %s %s: %w", i, ref.Kind, ref.Name, err)
		}
		keys := ref.Keys
		if len(keys) == 0 {
			for k := range data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
		}
		for _, k := range keys {
			raw, ok := data[k]
			if !ok {
				if ref.Optional {
					continue
				}
				return outcome.Terminalf(VarsNotFoundReason, "spec.varsFrom[%d]: %s %s/%s has no key %q: add it or remove it from keys", i, ref.Kind, s.stack.Namespace, ref.Name, k)
			}
			vars[k] = asJSONValue(raw)
			fromSecret[k] = ref.Kind == "Secret"
			if fromSecret[k] {
				secretVersions[k] = ref.Name + "@" + version
			} else {
				delete(secretVersions, k)
			}
		}
	}
	in := &inputs{vars: vars, secretVersions: secretVersions}
	for k, secret := range fromSecret {
		if secret {
			in.sensitive = append(in.sensitive, k)
		}
	}
	slices.Sort(in.sensitive)
	s.inputs = in
	in.digest = desiredDigest(s)
	return nil
}

// readVarsObject returns the data and resourceVersion of a varsFrom object
// (a Secret read directly, never cached) that the Stack's runner
// ServiceAccount may read (checkVarsAccess).
func (r *Reconciler) readVarsObject(ctx context.Context, s *scope, i int, ref terracev1.VarsReference) (map[string][]byte, string, error) {
	bound, err := r.checkVarsAccess(ctx, s, i, ref)
	if err != nil {
		return nil, "", err
	}
	if bound != nil {
		return bound.Data, bound.ResourceVersion, nil
	}
	key := types.NamespacedName{Namespace: s.stack.Namespace, Name: ref.Name}
	if ref.Kind == "Secret" {
		var sec corev1.Secret
		if err := r.APIReader.Get(ctx, key, &sec); err != nil {
			return nil, "", err
		}
		return sec.Data, sec.ResourceVersion, nil
	}
	var cm corev1.ConfigMap
	if err := r.Client.Get(ctx, key, &cm); err != nil {
		return nil, "", err
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return data, cm.ResourceVersion, nil
}

func isTerminalOrWaiting(err error) bool {
	var terminal *outcome.TerminalError
	var waiting *outcome.WaitingError
	return errors.As(err, &terminal) || errors.As(err, &waiting)
}

// asJSONValue keeps a value that is valid JSON (numbers, lists, objects) and
// makes anything else a JSON string.
func asJSONValue(raw []byte) json.RawMessage {
	if json.Valid(raw) {
		return json.RawMessage(raw)
	}
	quoted, _ := json.Marshal(string(raw))
	return quoted
}
