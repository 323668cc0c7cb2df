package tf

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestLockedProviders(t *testing.T) {
	dir := t.TempDir()
	if got, err := lockedProviders(dir); err != nil || len(got) != 0 {
		t.Fatalf("without a lock file: %v, %v; want none", got, err)
	}
	lock := `# This file is maintained automatically by "tofu init".
provider "registry.opentofu.org/hashicorp/null" {
  version     = "3.2.1"
  constraints = "~> 3.0"
  hashes = [
    "h1:abc=",
  ]
}

provider "registry.terraform.io/terrace-dev/testworld" {
  version = "0.1.0"
}
`
	if err := os.WriteFile(filepath.Join(dir, lockFile), []byte(lock), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := lockedProviders(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"registry.opentofu.org/hashicorp/null": "3.2.1", "registry.terraform.io/terrace-dev/testworld": "0.1.0"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("providers = %v, want %v", got, want)
	}
	if err := os.WriteFile(filepath.Join(dir, lockFile), []byte("provider {"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := lockedProviders(dir); err == nil {
		t.Error("a broken lock file was read without error")
	}
}

func TestOutputsFromState(t *testing.T) {
	state := []byte(`{
  "version": 4,
  "terraform_version": "1.12.6",
  "serial": 3,
  "lineage": "l",
  "outputs": {
    "name": {
      "value": "bench-1",
      "type": "string"
    },
    "token": {
      "value": "t0ken",
      "type": "string",
      "sensitive": true
    },
    "shape": {
      "value": {
        "n": 1
      },
      "type": [
        "object",
        {
          "n": "number"
        }
      ]
    }
  },
  "resources": [],
  "check_results": null
}`)
	outs, err := OutputsFromState(state)
	if err != nil {
		t.Fatal(err)
	}
	if o := outs["name"]; o.Sensitive || string(o.Value) != `"bench-1"` || string(o.Type) != `"string"` {
		t.Errorf("name = %+v", o)
	}
	if o := outs["token"]; !o.Sensitive || string(o.Value) != `"t0ken"` {
		t.Errorf("token = %+v, want the clear value flagged sensitive", o)
	}
	if o := outs["shape"]; string(o.Value) != `{"n":1}` || string(o.Type) != `["object",{"n":"number"}]` {
		t.Errorf("shape = %s %s, want compact JSON", o.Value, o.Type)
	}
	if outs, err := OutputsFromState(nil); err != nil || len(outs) != 0 {
		t.Errorf("empty state: %v, %v", outs, err)
	}
	encrypted := []byte(`{"serial":1,"lineage":"l","meta":{"key_provider.pbkdf2.k":"e30="},"encrypted_data":"c2VjcmV0","encryption_version":"v0"}`)
	if _, err := OutputsFromState(encrypted); err != ErrStateEncrypted {
		t.Errorf("encrypted state: err = %v, want ErrStateEncrypted", err)
	}
	if _, err := OutputsFromState([]byte(`{"version":3}`)); err == nil {
		t.Error("a version 3 state was read")
	}
}
