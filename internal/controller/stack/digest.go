package stack

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// desiredDigest is the one place the desired-state digest is computed:
// everything that decides what a plan does, so that a change of any of it
// makes the pending plan stale and a new plan due. It is built in layers
// whose order is fixed (a digest recorded in status.lastAppliedInputsDigest
// must stay the same for the same inputs): the module and the variables
// (Secret values by their Secrets' versions), then the run options, file
// mappings and plan policies, then spec.backend. Each layer is left out
// when the Stack uses none of it. The steps that read these (gatherInputs,
// gatherRunOptions, resolveBackend) only record them.
func desiredDigest(s *scope) string {
	in := s.inputs
	digest := inputsDigest(moduleAt{source: s.source.digest, path: s.stack.Spec.Path, workspace: s.stack.Spec.Workspace}, in.vars, in.secretVersions)
	if o := s.options; o != nil {
		digest = optionsDigest(digest, &s.stack.Spec, o.fileVersions, o.policies.digest())
	}
	if s.backend != nil {
		digest = backendDigest(digest, s.backend.GetType(), s.backend.GetConfigJson(), s.backendVersions)
	}
	return digest
}

// moduleAt is what, besides the variables, decides what a plan does.
type moduleAt struct{ source, path, workspace string }

func inputsDigest(m moduleAt, vars map[string]json.RawMessage, secretVersions map[string]string) string {
	h := sha256.New()
	fmt.Fprintf(h, "source=%s\npath=%s\nworkspace=%s\n", m.source, m.path, m.workspace)
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if v, ok := secretVersions[k]; ok {
			fmt.Fprintf(h, "secret var %q=%s\n", k, v)
			continue
		}
		fmt.Fprintf(h, "var %q=%d:%s\n", k, len(vars[k]), vars[k])
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// optionsDigest extends the inputs digest with what else decides a plan.
// Without any run option, file mapping or policy it is the digest as is,
// so Stacks that use none keep their recorded digests.
func optionsDigest(base string, spec *terracev1.StackSpec, fileVersions []string, policiesDigest string) string {
	var b strings.Builder
	for _, t := range spec.Targets {
		fmt.Fprintf(&b, "target %q\n", t)
	}
	for _, a := range spec.Replace {
		fmt.Fprintf(&b, "replace %q\n", a)
	}
	for _, f := range spec.VarsFiles {
		fmt.Fprintf(&b, "var file %q\n", f)
	}
	if spec.Refresh != nil && !*spec.Refresh {
		b.WriteString("refresh false\n")
	}
	for i, v := range fileVersions {
		m := spec.FileMappings[i]
		fmt.Fprintf(&b, "file %s %q %s\n", m.Location, m.Path, v)
	}
	if policiesDigest != "" {
		fmt.Fprintf(&b, "policies %s\n", policiesDigest)
	}
	if b.Len() == 0 {
		return base
	}
	h := sha256.Sum256([]byte(base + "\n" + b.String()))
	return "sha256:" + hex.EncodeToString(h[:])
}

// backendDigest extends the digest with spec.backend: its type, config
// and credentials by Secret version (never their values).
func backendDigest(base, backendType string, configJSON []byte, credentials []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "inputs=%s\nbackend=%s\nconfig=%s\n", base, backendType, configJSON)
	for _, c := range credentials {
		h.Write([]byte(c))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
