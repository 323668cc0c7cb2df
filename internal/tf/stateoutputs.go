package tf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrStateEncrypted says a state file is encrypted by tofu itself
// (OpenTofu's client-side state encryption): only tofu, with the key in
// the module's configuration, can read its outputs.
var ErrStateEncrypted = errors.New("the state is encrypted by tofu")

// stateFile is the part of a state file (format version 4) that holds the
// root outputs, plus the marks of an encrypted one.
type stateFile struct {
	Version       *int                        `json:"version"`
	Outputs       map[string]stateOutputValue `json:"outputs"`
	EncryptedData json.RawMessage             `json:"encrypted_data"`
}

type stateOutputValue struct {
	Value     json.RawMessage `json:"value"`
	Type      json.RawMessage `json:"type"`
	Sensitive bool            `json:"sensitive"`
}

// OutputsFromState reads the root outputs, with their sensitivity and
// type, from a state file as tofu's http backend stores it: what `output
// -json` prints (values compact), without running tofu. An empty state has no outputs. A
// state encrypted by tofu gives ErrStateEncrypted (ask tofu instead).
func OutputsFromState(state []byte) (map[string]OutputValue, error) {
	if len(bytes.TrimSpace(state)) == 0 {
		return map[string]OutputValue{}, nil
	}
	var f stateFile
	if err := json.Unmarshal(state, &f); err != nil {
		return nil, fmt.Errorf("failed to parse the state: %w", err)
	}
	if len(f.EncryptedData) > 0 {
		return nil, ErrStateEncrypted
	}
	if f.Version == nil || *f.Version != 4 {
		return nil, fmt.Errorf("failed to read the state: format version %s is not 4", versionText(f.Version))
	}
	out := make(map[string]OutputValue, len(f.Outputs))
	for name, o := range f.Outputs {
		// The state is indented; values are handed on compact.
		value, typ := compactJSON(o.Value), compactJSON(o.Type)
		out[name] = OutputValue{Sensitive: o.Sensitive, Type: typ, Value: value}
	}
	return out, nil
}

func versionText(v *int) string {
	if v == nil {
		return "(none)"
	}
	return fmt.Sprint(*v)
}

func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}
