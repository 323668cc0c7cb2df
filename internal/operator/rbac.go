package operator

// Rights the controller needs in its own namespace only, generated into a
// Role there (config/rbac/role.yaml): the leader-election Lease, and the
// core Events that leader election records on it.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=terrace-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=terrace-system
