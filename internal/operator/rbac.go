package operator

// Rights the controller needs in its own namespace only, generated into a
// Role there (config/rbac/role.yaml): the leader-election Lease, and the
// core Events that leader election records on it.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=terrace-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=terrace-system

// The controller's roles, generated from the markers (make generate writes
// config/rbac/role.yaml). Markers of cluster-scoped resources carry
// roleName=terrace-controller-cluster; the others go into
// terrace-controller, so that role can be bound per namespace.
// TestControllerRolesSplitByScope keeps the split true.
const (
	// NamespacedRole is the ClusterRole of every namespaced right: Stacks,
	// Programs, TerraceConfigs, Secrets, runner pods, the API servers'
	// objects, Events. The all-namespaces install mode binds it with a
	// ClusterRoleBinding; the namespaced mode with a RoleBinding
	// NamespacedRoleBinding in each watched namespace (--watch-namespaces).
	NamespacedRole = "terrace-controller"
	// ClusterScopeRole is the ClusterRole of the cluster-scoped rights
	// (TokenReviews, SubjectAccessReviews): bound cluster-wide in both modes.
	ClusterScopeRole = "terrace-controller-cluster"
	// NamespacedRoleBinding names the namespaced mode's RoleBindings of
	// NamespacedRole (the chart's and config/namespaced's).
	NamespacedRoleBinding = "terrace-controller-namespaced"
)
