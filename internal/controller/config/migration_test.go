package config

import (
	"errors"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
)

func TestMigrationStatus(t *testing.T) {
	secrets, pg := terracev1.StateBackendSecrets, terracev1.StateBackendPostgres
	pending := settings.StateLocation{Current: secrets, Desired: pg}
	done := settings.StateLocation{Current: pg, Desired: pg}
	cases := []struct {
		name        string
		steps       [][2]settings.StateLocation // before, after per namespace
		err         error
		wantCurrent terracev1.StateBackend
		wantTarget  terracev1.StateBackend
		wantPhase   string
		wantCounts  [2]int32
	}{
		{"nothing to move", [][2]settings.StateLocation{{done, done}}, nil, pg, "", "", [2]int32{2, 2}},
		{"moved now", [][2]settings.StateLocation{{pending, done}, {done, done}}, nil, pg, "", MigrationVerified, [2]int32{4, 4}},
		{"waiting for runs", [][2]settings.StateLocation{{done, done}, {pending, pending}},
			outcome.Waiting(StateMigratingReason, migrationRecheck, errors.New("waiting for 1 run(s)")), secrets, pg, MigrationMigrating, [2]int32{2, 4}},
		{"copy failed", [][2]settings.StateLocation{{pending, pending}},
			outcome.Waiting(StateMigrationFailedReason, migrationRecheck, errors.New("copy failed")), secrets, pg, MigrationFailed, [2]int32{0, 2}},
		{"an unexpected error", [][2]settings.StateLocation{{pending, pending}}, errors.New("boom"), secrets, pg, MigrationFailed, [2]int32{0, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &migrationProgress{desired: pg}
			for _, s := range tc.steps {
				p.add(s[0], s[1], 2)
			}
			st := p.report(tc.err)
			if st.Current != tc.wantCurrent || st.Target != tc.wantTarget || st.Phase != tc.wantPhase || st.Migrated != tc.wantCounts[0] || st.Total != tc.wantCounts[1] {
				t.Fatalf("status %+v", st)
			}
			if tc.err != nil && st.Message != tc.err.Error() {
				t.Errorf("message %q", st.Message)
			}
		})
	}
}

func TestVerifiedIsKeptUntilTheNextMove(t *testing.T) {
	cfg := &terracev1.TerraceConfig{}
	previous := &terracev1.StateBackendStatus{Current: terracev1.StateBackendPostgres, Phase: MigrationVerified, Message: "moved at noon"}
	applyMigrationStatus(cfg, previous, &terracev1.StateBackendStatus{Current: terracev1.StateBackendPostgres})
	if got := cfg.Status.StateBackend; got.Phase != MigrationVerified || got.Message != "moved at noon" {
		t.Errorf("verified record lost: %+v", got)
	}
	applyMigrationStatus(cfg, previous, &terracev1.StateBackendStatus{Current: terracev1.StateBackendSecrets})
	if got := cfg.Status.StateBackend; got.Phase != "" {
		t.Errorf("an old record kept for another backend: %+v", got)
	}
}
