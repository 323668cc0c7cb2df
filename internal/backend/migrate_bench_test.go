package backend_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// BenchmarkMigrateNamespace moves a namespace of 20 Stacks (two 100 KiB
// state versions each) from Secrets to PostgreSQL, and reports the move
// against the baseline of writing the same states into Secrets in the
// same run: ratio = move time / write time.
func BenchmarkMigrateNamespace(b *testing.B) {
	const stacks, size = 20, 100 << 10
	for b.Loop() {
		b.StopTimer()
		t := b
		ns := env.Namespace(t)
		putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL)})
		backends := newBackends(t)
		set, err := backends.For(ctx(t), ns)
		if err != nil {
			b.Fatal(err)
		}
		wrote := time.Now()
		for i := range stacks {
			key := state.Key{Namespace: ns, Stack: fmt.Sprintf("app-%d", i), Workspace: state.DefaultWorkspace}
			for serial := int64(1); serial <= 2; serial++ {
				if _, err := set.States.Put(ctx(t), key, storetest.StateJSON("l-"+key.Stack, serial, int(serial), size), state.PutOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
		write := time.Since(wrote)
		putConfig(t, ns, postgresSpec("pg"))
		b.StartTimer()
		moved := time.Now()
		_, report, err := backends.MigrateNamespace(ctx(t), ns, logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		move := time.Since(moved)
		if report.States != stacks || report.Versions != 2*stacks {
			b.Fatalf("moved %s", report)
		}
		b.ReportMetric(float64(write.Milliseconds()), "write-ms")
		b.ReportMetric(float64(move.Milliseconds()), "move-ms")
		b.ReportMetric(move.Seconds()/write.Seconds(), "move/write")
	}
}
