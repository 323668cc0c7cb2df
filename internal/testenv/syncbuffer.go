package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that goroutines may write while a test
// reads it: where tests collect what a server or controller logs.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
