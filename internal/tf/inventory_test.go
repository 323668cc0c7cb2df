package tf

import (
	"errors"
	"strings"
	"testing"
)

func TestInventoryFromState(t *testing.T) {
	tests := []struct {
		name, state, want string
		wantErr           error
	}{
		{name: "empty state", state: "", want: ""},
		{
			name: "managed instances with count, for_each and modules; data sources left out",
			state: `{"version":4,"resources":[
				{"mode":"managed","type":"terraform_data","name":"a","instances":[{}]},
				{"mode":"data","type":"terraform_remote_state","name":"x","instances":[{}]},
				{"module":"module.net","mode":"managed","type":"aws_subnet","name":"this","instances":[{"index_key":"b"},{"index_key":"a"}]},
				{"mode":"managed","type":"terraform_data","name":"n","instances":[{"index_key":0},{"index_key":1}]}
			]}`,
			want: `module.net.aws_subnet.this["a"],module.net.aws_subnet.this["b"],terraform_data.a,terraform_data.n[0],terraform_data.n[1]`,
		},
		{name: "encrypted by tofu", state: `{"encrypted_data":"abc","encryption_version":"v0"}`, wantErr: ErrStateEncrypted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := InventoryFromState([]byte(tt.state))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("inventory %q, want %q", strings.Join(got, ","), tt.want)
			}
		})
	}
	if _, err := InventoryFromState([]byte(`{"version":3}`)); err == nil {
		t.Error("a state of format 3 was read")
	}
}
