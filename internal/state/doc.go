// Package state keeps OpenTofu/Terraform state, saved plans and the
// bookkeeping around them (locks, history, migration marks) for every Stack,
// outside any controller's memory.
//
// # The pieces
//
//   - [Store] holds the state of one (namespace, stack, workspace) [Key]:
//     [Store.Get] the current state, [Store.Put] a new one with
//     compare-and-swap ([PutOptions.IfMatch]) and the OpenTofu rules (a lower
//     serial or a foreign lineage is refused with a [*ConflictError]), the last
//     N versions ([Store.ListVersions], [Store.GetVersion]), and the lock tofu
//     takes around every operation ([Store.Lock], [Store.Unlock],
//     [Store.ForceUnlock]). A held lock is reported as a [*LockedError]
//     carrying the holder's [LockInfo].
//   - [PlanStore] holds saved plan files awaiting approval, by plan id, with an
//     optional readable rendering.
//   - internal/release holds one release record per applied revision.
//
// Two implementations exist, with the same behaviour (both pass
// storetest.RunConformance): state/secrets keeps everything in Secrets of the
// Stack's namespace (gzip, chunked under the Secret size limit, optionally
// AES-256-GCM), state/postgres keeps it in PostgreSQL. state/httpbackend serves
// a Store as the Terraform "http" backend to runners, and state/migrate copies
// everything between two backends and adopts tofu-controller state Secrets.
//
// # Using it from a controller
//
//	st := backend.States
//	cur, err := st.Get(ctx, key)            // errors.Is(err, state.ErrNotFound) when none
//	meta, err := st.Put(ctx, key, data, state.PutOptions{IfMatch: cur.Version})
//	var conflict *state.ConflictError       // errors.As: version moved, serial went back, lineage differs
//	var locked *state.LockedError           // errors.As: locked.Holder says who holds the lock
//	err = st.ForceUnlock(ctx, key)          // when the run holding the lock is known dead
//	err = st.Delete(ctx, key)               // state, history and lock, e.g. on Stack deletion
//
// Errors never carry state contents, and nothing here logs them.
package state
