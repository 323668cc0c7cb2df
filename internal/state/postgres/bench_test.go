package postgres_test

import (
	"context"
	"testing"

	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// go test -run '^$' -bench . -benchtime 5x ./internal/state/postgres/
func BenchmarkPutGet(b *testing.B) {
	s, err := postgres.Open(context.Background(), dbURL, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.RunBenchmarks(b, s, uniqueNamespace())
}
