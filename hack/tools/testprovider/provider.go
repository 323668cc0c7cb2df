package main

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
)

// testfileProvider has no configuration; its only resource is testfile_file.
type testfileProvider struct {
	version string
}

var _ provider.Provider = (*testfileProvider)(nil)

func newProvider(version string) func() provider.Provider {
	return func() provider.Provider {
		return &testfileProvider{version: version}
	}
}

func (p *testfileProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "testfile"
	resp.Version = p.version
}

func (p *testfileProvider) Schema(_ context.Context, _ provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Manages plain files on the local disk; made for Terrace's drift tests.",
	}
}

func (p *testfileProvider) Configure(context.Context, provider.ConfigureRequest, *provider.ConfigureResponse) {
}

func (p *testfileProvider) Resources(context.Context) []func() resource.Resource {
	return []func() resource.Resource{newFileResource}
}

func (p *testfileProvider) DataSources(context.Context) []func() datasource.DataSource {
	return nil
}
