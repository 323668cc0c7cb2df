package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// fileResource is testfile_file: a file whose content the configuration owns.
// Read reports what is on disk, so an edit by hand shows up as drift.
type fileResource struct{}

var _ resource.ResourceWithImportState = (*fileResource)(nil)

// fileModel mirrors the testfile_file schema.
type fileModel struct {
	ID      types.String `tfsdk:"id"`
	Path    types.String `tfsdk:"path"`
	Content types.String `tfsdk:"content"`
}

func newFileResource() resource.Resource {
	return &fileResource{}
}

func (r *fileResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_file"
}

func (r *fileResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "A file on the local disk with the given content.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Description: "The file's path.",
				Computed:    true,
				PlanModifiers: []planmodifier.String{
					stringplanmodifier.UseStateForUnknown(),
				},
			},
			"path": schema.StringAttribute{
				Description: "Where the file lives; parent directories are created. Changing it replaces the file.",
				Required:    true,
				PlanModifiers: []planmodifier.String{
					stringplanmodifier.RequiresReplace(),
				},
			},
			"content": schema.StringAttribute{
				Description: "The file's content.",
				Required:    true,
			},
		},
	}
}

func (r *fileResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan fileModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := writeFile(plan.Path.ValueString(), plan.Content.ValueString()); err != nil {
		resp.Diagnostics.AddError("Failed to create file", err.Error())
		return
	}
	plan.ID = plan.Path
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *fileResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state fileModel
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	data, err := os.ReadFile(state.Path.ValueString())
	if errors.Is(err, fs.ErrNotExist) {
		// Gone from disk: drop it from state so the plan creates it again.
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		resp.Diagnostics.AddError("Failed to read file", fmt.Sprintf("failed to read %s: %v", state.Path.ValueString(), err))
		return
	}
	state.Content = types.StringValue(string(data))
	state.ID = state.Path
	resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
}

func (r *fileResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan fileModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := writeFile(plan.Path.ValueString(), plan.Content.ValueString()); err != nil {
		resp.Diagnostics.AddError("Failed to update file", err.Error())
		return
	}
	plan.ID = plan.Path
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *fileResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state fileModel
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	err := os.Remove(state.Path.ValueString())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		resp.Diagnostics.AddError("Failed to delete file", fmt.Sprintf("failed to remove %s: %v", state.Path.ValueString(), err))
	}
}

// ImportState takes the file's path as the import ID; Read then fills in the content.
func (r *fileResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("path"), req.ID)...)
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("id"), req.ID)...)
}

// writeFile writes content to name with mode 0644, creating parent directories.
func writeFile(name, content string) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return fmt.Errorf("failed to create the parent directory of %s: %w", name, err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		return fmt.Errorf("failed to write %s: %w", name, err)
	}
	// WriteFile honours the umask and keeps an existing file's mode; the file is always 0644.
	if err := os.Chmod(name, 0o644); err != nil {
		return fmt.Errorf("failed to set the mode of %s: %w", name, err)
	}
	return nil
}
