package settings

import terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"

// StateLocation says where a namespace's state is (Current) and where its
// effective TerraceConfig wants it (Desired).
type StateLocation struct {
	Current terracev1.StateBackend
	Desired terracev1.StateBackend
}

// Pending reports a migration still to be done: runs wait for it.
func (l StateLocation) Pending() bool { return l.Current != l.Desired }
