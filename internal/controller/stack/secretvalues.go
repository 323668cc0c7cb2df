package stack

import (
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/tf"
)

// secretValues recognises the values of the run's variables that came from
// Secrets (any type, any length), so a release record holds back outputs
// built from them. The runner is told the same variables' names and masks
// their values in logs and plans itself.
func (in *inputs) secretValues() release.SecretValues {
	if in == nil || len(in.sensitive) == 0 {
		return nil
	}
	r := tf.NewRedactor()
	for _, name := range in.sensitive {
		if raw, ok := in.vars[name]; ok {
			r.AddJSON(raw)
		}
	}
	return r
}

// sensitiveNames are the variables that came from Secrets, for a runner
// applying a plan another runner made.
func (in *inputs) sensitiveNames() []string {
	if in == nil {
		return nil
	}
	return in.sensitive
}
