package apiserver

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
	"github.com/terrace-dev/terrace/proto/terrace/api/v1/apiv1connect"
)

// service implements terrace.api.v1.InstallationService.
type service struct {
	apiv1connect.UnimplementedInstallationServiceHandler
	*Server
}

var _ apiv1connect.InstallationServiceHandler = (*service)(nil)

// call is one authenticated call.
type call struct {
	caller *caller
	// site is where it acts: the request's cluster and namespace.
	site *site
	// name is the installation's name, validated; "" for List and Create.
	name string
}

// target is what a request names: the cluster, the namespace there (""
// for the site's own) and the Stack.
type target struct {
	cluster, namespace, name string
}

// targeted is a request naming a Stack in a namespace of a cluster.
type targeted interface {
	GetCluster() string
	GetNamespace() string
	GetName() string
}

func targetOf(req targeted) target {
	return target{cluster: req.GetCluster(), namespace: req.GetNamespace(), name: req.GetName()}
}

// begin checks the call's target, name and caller; the context it returns
// carries the caller's token, for every Kubernetes request of the call.
// What the caller may do is the Kubernetes API's to decide, request by
// request, in whichever namespace the request names.
func (s *service) begin(ctx context.Context, header http.Header, to target, named bool) (context.Context, *call, error) {
	info := infoOf(ctx)
	info.name = to.name
	token, err := bearerToken(header)
	if err != nil {
		return ctx, nil, err
	}
	if named {
		if err := validateName("installation name", to.name); err != nil {
			return ctx, nil, invalid(err.Error())
		}
	}
	st, err := s.site(ctx, to.cluster)
	if err != nil {
		return ctx, nil, err
	}
	if st, err = st.in(to.namespace); err != nil {
		return ctx, nil, err
	}
	caller, ctx, err := s.authenticate(ctx, token, st)
	if err != nil {
		return ctx, nil, err
	}
	info.user = caller.Username
	c := &call{caller: caller, site: st}
	if named {
		c.name = to.name
	}
	return ctx, c, nil
}

func (s *service) Create(ctx context.Context, req *connect.Request[apiv1.CreateRequest]) (*connect.Response[apiv1.Installation], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), false)
	if err != nil {
		return nil, err
	}
	in, err := c.site.create(ctx, c, req.Msg)
	if err != nil {
		return nil, err
	}
	in.Cluster = c.site.Cluster
	return connect.NewResponse(in), nil
}

func (s *service) Get(ctx context.Context, req *connect.Request[apiv1.GetRequest]) (*connect.Response[apiv1.Installation], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	stack, err := c.site.stack(ctx, c.name)
	if err != nil {
		return nil, err
	}
	in := installationOf(stack)
	in.Cluster = c.site.Cluster
	return connect.NewResponse(in), nil
}

func (s *service) List(ctx context.Context, req *connect.Request[apiv1.ListRequest]) (*connect.Response[apiv1.ListResponse], error) {
	ctx, c, err := s.begin(ctx, req.Header(), target{cluster: req.Msg.GetCluster(), namespace: req.Msg.GetNamespace()}, false)
	if err != nil {
		return nil, err
	}
	out, err := c.site.list(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	for _, in := range out.Items {
		in.Cluster = c.site.Cluster
	}
	return connect.NewResponse(out), nil
}

func (s *service) UpdateValues(ctx context.Context, req *connect.Request[apiv1.UpdateValuesRequest]) (*connect.Response[apiv1.Installation], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	in, err := c.site.updateValues(ctx, c, req.Msg)
	if err != nil {
		return nil, err
	}
	in.Cluster = c.site.Cluster
	return connect.NewResponse(in), nil
}

func (s *service) GetPlan(ctx context.Context, req *connect.Request[apiv1.GetPlanRequest]) (*connect.Response[apiv1.Plan], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	plan, err := c.site.plan(ctx, c)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(plan), nil
}

func (s *service) ApprovePlan(ctx context.Context, req *connect.Request[apiv1.ApprovePlanRequest]) (*connect.Response[apiv1.Installation], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	in, err := c.site.approve(ctx, c, req.Msg.GetPlanId())
	if err != nil {
		return nil, err
	}
	in.Cluster = c.site.Cluster
	return connect.NewResponse(in), nil
}

func (s *service) ListReleases(ctx context.Context, req *connect.Request[apiv1.ListReleasesRequest]) (*connect.Response[apiv1.ListReleasesResponse], error) {
	// Release records hold output values: reading them takes the right to list Secrets.
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	out, err := c.site.releases(ctx, c)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (s *service) GetOutputs(ctx context.Context, req *connect.Request[apiv1.GetOutputsRequest]) (*connect.Response[apiv1.GetOutputsResponse], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	out, err := c.site.outputs(ctx, c)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (s *service) Delete(ctx context.Context, req *connect.Request[apiv1.DeleteRequest]) (*connect.Response[apiv1.Installation], error) {
	ctx, c, err := s.begin(ctx, req.Header(), targetOf(req.Msg), true)
	if err != nil {
		return nil, err
	}
	in, err := c.site.delete(ctx, c)
	if err != nil {
		return nil, err
	}
	in.Cluster = c.site.Cluster
	return connect.NewResponse(in), nil
}
