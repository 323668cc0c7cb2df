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
//     [Store.ForceUnlock], [Store.GetLock]). A held lock is reported as a
//     [*LockedError] carrying the holder's [LockInfo].
//   - [PlanStore] holds saved plan files awaiting approval, by plan id, with an
//     optional readable rendering ([Plan.Readable], already redacted by the caller).
//   - internal/release holds one release record per applied revision
//     (release.History records them and keeps deployed/superseded/failed in order).
//   - [DeleteStack] removes a Stack's states and plans (nothing is owned by
//     the Stack object: call it, and release.History.DeleteAll, on deletion).
//
// Two implementations exist, with the same behaviour (both pass
// storetest.RunConformance):
//
//   - state/secrets: Secrets in the Stack's namespace; gzip, chunked under the
//     Secret size limit, optionally AES-256-GCM ([EncryptionKey], from a
//     Secret with secrets.KeyFromSecret). secrets.New(client, secrets.Options{History, Keys})
//     gives one value that is Store, PlanStore and release.Store. Pass an
//     uncached client (or one whose cache is limited to Terrace's Secrets).
//   - state/postgres: postgres.Open(ctx, url, postgres.Options{History, Keys})
//     gives one value that is Store, PlanStore and release.Store; Close it.
//
// state/httpbackend serves a Store as the Terraform "http" backend to
// runners (httpbackend.NewServer is a manager Runnable on every replica;
// httpbackend.Address builds the address a runner's backend block uses), and
// state/migrate copies everything between backends (migrate.Migrate) and
// adopts tofu-controller state Secrets (migrate.Adopt).
//
// # Using it from a controller
//
//	key := state.Key{Namespace: ns, Stack: name, Workspace: ws}
//	cur, err := st.Get(ctx, key)            // errors.Is(err, state.ErrNotFound) when none
//	meta, err := st.Put(ctx, key, data, state.PutOptions{IfMatch: cur.Version})
//	var conflict *state.ConflictError       // errors.As: version moved, serial went back, lineage differs
//	var locked *state.LockedError           // errors.As: locked.Holder says who holds the lock
//	holder, err := st.GetLock(ctx, key)     // nil when unlocked
//	err = st.ForceUnlock(ctx, key)          // when the run holding the lock is known dead
//	errors.Is(err, state.ErrMigrated)       // the entry moved to another backend: use that one
//
//	plan := state.Plan{PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: name, ID: planID},
//	    ReadableFormat: state.ReadableJSON}, Binary: planFile, Readable: redactedJSON}
//	_, err = plans.PutPlan(ctx, plan)       // idempotent for the same bytes
//	p, err := plans.GetPlan(ctx, plan.Key)  // verified against its digests
//
// Errors never carry state contents, and nothing here logs them.
package state
