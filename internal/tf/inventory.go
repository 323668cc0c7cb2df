package tf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
)

// stateResources is the part of a state file (format 4) that lists resources.
type stateResources struct {
	Version       *int            `json:"version"`
	EncryptedData json.RawMessage `json:"encrypted_data"`
	Resources     []struct {
		Module    string `json:"module"`
		Mode      string `json:"mode"`
		Type      string `json:"type"`
		Name      string `json:"name"`
		Instances []struct {
			IndexKey json.RawMessage `json:"index_key"`
		} `json:"instances"`
	} `json:"resources"`
}

// InventoryFromState lists the addresses of the managed resource instances
// in a state file, sorted, as `tofu state list` prints them (data sources
// are not part of an inventory). An empty state has none; a state
// encrypted by tofu gives ErrStateEncrypted.
func InventoryFromState(state []byte) ([]string, error) {
	if len(bytes.TrimSpace(state)) == 0 {
		return nil, nil
	}
	var f stateResources
	if err := json.Unmarshal(state, &f); err != nil {
		return nil, fmt.Errorf("failed to parse the state: %w", err)
	}
	if len(f.EncryptedData) > 0 {
		return nil, ErrStateEncrypted
	}
	if f.Version == nil || *f.Version != 4 {
		return nil, fmt.Errorf("failed to read the state: format version %s is not 4", versionText(f.Version))
	}
	var out []string
	for _, r := range f.Resources {
		if r.Mode != "managed" {
			continue
		}
		base := r.Type + "." + r.Name
		if r.Module != "" {
			base = r.Module + "." + base
		}
		for _, inst := range r.Instances {
			out = append(out, base+indexSuffix(inst.IndexKey))
		}
	}
	sort.Strings(out)
	return out, nil
}

// indexSuffix renders a count or for_each key: [0] or ["name"].
func indexSuffix(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return "[" + strconv.Quote(s) + "]"
	}
	return "[" + string(raw) + "]"
}
