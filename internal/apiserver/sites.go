package apiserver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// site is where a call acts: a cluster, the namespace there, and the
// clients that act as the caller in it.
type site struct {
	// Cluster is the request's cluster; "" for the server's own.
	Cluster   string
	Namespace string
	// Caller makes every request with the call's token (CallerClient).
	Caller client.WithWatch
	// Stores opens the namespace's plan and release stores through Caller;
	// nil where they cannot be opened.
	Stores StoreOpener
	Log    logr.Logger
}

// in is the site for namespace: the same cluster and clients, acting in
// another namespace ("" or the site's own: the site itself). Nothing is
// checked beyond the name's form: the caller's RBAC there decides.
func (s *site) in(namespace string) (*site, error) {
	if namespace == "" || namespace == s.Namespace {
		return s, nil
	}
	if problems := validation.IsDNS1123Label(namespace); len(problems) > 0 {
		return nil, invalid(fmt.Sprintf("namespace %q is not a valid namespace name: %s", namespace, strings.Join(problems, "; ")))
	}
	other := *s
	other.Namespace = namespace
	other.Log = s.Log.WithValues("namespace", namespace)
	return &other, nil
}

// remoteSites caches the clients of registered clusters by what they were
// made from, so a changed registration gets new ones.
type remoteSites struct {
	mu    sync.Mutex
	sites map[string]*site
}

// site returns where a call for cluster acts. Other clusters are those the
// operator registered (Server.Clusters, from the operator namespace's
// TerraceConfig): never a namespace's own, since a cluster is where the
// caller's token is sent. An unknown one is INVALID_ARGUMENT naming the
// known ones, before anything is done or sent anywhere.
func (s *Server) site(ctx context.Context, cluster string) (*site, error) {
	if cluster == "" {
		return &site{Namespace: s.Namespace, Caller: s.Caller, Stores: s.Stores, Log: s.Log}, nil
	}
	var known []string
	var found *terracev1.APICluster
	for i := range s.Clusters {
		c := &s.Clusters[i]
		known = append(known, c.Name)
		if c.Name == cluster {
			found = c
		}
	}
	if found == nil {
		list := "none are registered (the operator namespace's TerraceConfig spec.api.clusters)"
		if len(known) > 0 {
			slices.Sort(known)
			list = "the known ones are " + strings.Join(known, ", ")
		}
		return nil, failure(connect.CodeInvalidArgument, reasonUnknownCluster,
			fmt.Sprintf("cluster %s is not known to this server: %s; leave cluster empty for the cluster it runs in", cluster, list))
	}
	return s.remote.get(found, s)
}

func (r *remoteSites) get(c *terracev1.APICluster, s *Server) (*site, error) {
	namespace := c.Namespace
	if namespace == "" {
		namespace = s.Namespace
	}
	key := strings.Join([]string{c.Name, c.Server, c.CABundle, namespace}, "\x00")
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, ok := r.sites[key]; ok {
		return st, nil
	}
	caller, err := CallerClient(&rest.Config{Host: c.Server, TLSClientConfig: rest.TLSClientConfig{CAData: []byte(c.CABundle)}}, s.Caller.Scheme())
	if err != nil {
		return nil, fmt.Errorf("failed to make a client of cluster %s: %w", c.Name, err)
	}
	st := &site{Cluster: c.Name, Namespace: namespace, Caller: caller, Log: s.Log.WithValues("cluster", c.Name)}
	if s.StoresFor != nil {
		st.Stores = s.StoresFor(caller)
	}
	if r.sites == nil {
		r.sites = map[string]*site{}
	}
	r.sites[key] = st
	return st, nil
}
