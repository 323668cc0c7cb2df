package secrets_test

import (
	"testing"

	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// go test -run '^$' -bench . -benchtime 5x ./internal/state/secrets/
func BenchmarkPutGet(b *testing.B) {
	storetest.RunBenchmarks(b, secrets.New(env.Client, secrets.Options{}), env.Namespace(b))
}
