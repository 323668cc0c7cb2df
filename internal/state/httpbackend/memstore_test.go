package httpbackend_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
)

// memStore is an in-memory state.Store for the fuzz target: the same rules
// as the real stores (state helpers for versions, serials, lineages and
// locks), no I/O, and a record of every key it was asked about.
type memStore struct {
	mu      sync.Mutex
	states  map[state.Key][]state.State // oldest first
	locks   map[state.Key]state.LockInfo
	touched []state.Key
}

func newMemStore() *memStore {
	return &memStore{states: map[state.Key][]state.State{}, locks: map[state.Key]state.LockInfo{}}
}

func (m *memStore) touch(key state.Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.touched = append(m.touched, key)
}

func (m *memStore) touchedKeys() []state.Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.touched)
}

func (m *memStore) current(key state.Key) *state.State {
	versions := m.states[key]
	if len(versions) == 0 {
		return nil
	}
	s := versions[len(versions)-1]
	return &s
}

func (m *memStore) heldLock(key state.Key) *state.LockInfo {
	l, ok := m.locks[key]
	if !ok {
		return nil
	}
	return &l
}

func (m *memStore) Get(_ context.Context, key state.Key) (*state.State, error) {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.current(key); s != nil {
		return s, nil
	}
	return nil, &state.NotFoundError{What: "state " + key.String()}
}

func (m *memStore) Put(_ context.Context, key state.Key, data []byte, opts state.PutOptions) (state.StateMeta, error) {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	header, err := state.ParseHeader(data)
	if err != nil {
		return state.StateMeta{}, err
	}
	if err := state.CheckLock(key.String(), m.heldLock(key), opts.LockID); err != nil {
		return state.StateMeta{}, err
	}
	cur := m.current(key)
	var curVersion state.Version
	var curMeta *state.StateMeta
	if cur != nil {
		curVersion, curMeta = cur.Version, &cur.StateMeta
	}
	if err := state.CheckVersion(key.String(), curVersion, opts.IfMatch); err != nil {
		return state.StateMeta{}, err
	}
	if err := state.CheckSuccessor(key.String(), curMeta, header, opts.Force); err != nil {
		return state.StateMeta{}, err
	}
	meta := state.StateMeta{Key: key, Version: curVersion + 1, Serial: header.Serial, Lineage: header.Lineage,
		Digest: state.Digest(data), Size: int64(len(data)), CreatedAt: time.Now()}
	m.states[key] = append(m.states[key], state.State{StateMeta: meta, Data: slices.Clone(data)})
	return meta, nil
}

func (m *memStore) Delete(_ context.Context, key state.Key) error {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.states, key)
	delete(m.locks, key)
	return nil
}

func (m *memStore) ListVersions(_ context.Context, key state.Key) ([]state.StateMeta, error) {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []state.StateMeta
	for _, s := range slices.Backward(m.states[key]) {
		out = append(out, s.StateMeta)
	}
	return out, nil
}

func (m *memStore) GetVersion(_ context.Context, key state.Key, version state.Version) (*state.State, error) {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.states[key] {
		if s.Version == version {
			return &s, nil
		}
	}
	return nil, &state.NotFoundError{What: fmt.Sprintf("state %s version %d", key, version)}
}

func (m *memStore) Lock(_ context.Context, key state.Key, info state.LockInfo) error {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if held := m.heldLock(key); held != nil && !state.SameLock(held, info) {
		return &state.LockedError{Key: key.String(), Holder: held, Offered: info.ID}
	}
	m.locks[key] = info
	return nil
}

func (m *memStore) Unlock(_ context.Context, key state.Key, id string) error {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.heldLock(key)
	if held == nil {
		return nil
	}
	if err := state.CheckLock(key.String(), held, id); err != nil {
		return err
	}
	delete(m.locks, key)
	return nil
}

func (m *memStore) ForceUnlock(_ context.Context, key state.Key) error {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.locks, key)
	return nil
}

func (m *memStore) GetLock(_ context.Context, key state.Key) (*state.LockInfo, error) {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.heldLock(key), nil
}

func (m *memStore) List(_ context.Context, namespace string) ([]state.Key, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.touched = append(m.touched, state.Key{Namespace: namespace})
	var out []state.Key
	for k := range m.states {
		if namespace == "" || k.Namespace == namespace {
			out = append(out, k)
		}
	}
	return out, nil
}

func (m *memStore) ReplaceHistory(_ context.Context, key state.Key, versions []state.State) error {
	m.touch(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states[key] = slices.Clone(versions)
	return nil
}

func (m *memStore) Migrated(_ context.Context, key state.Key) (*state.MigrationMark, error) {
	m.touch(key)
	return nil, nil
}

func (m *memStore) MarkMigrated(_ context.Context, key state.Key, _ *state.MigrationMark) error {
	m.touch(key)
	return nil
}
