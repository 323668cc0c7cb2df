package apiserver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/ownership"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

const (
	valuesSuffix  = "-values"
	outputsSuffix = "-outputs"
)

// newStack builds the Stack of an installation reading its values from
// the Secret valuesSecret.
func (s *site) newStack(req *apiv1.CreateRequest, valuesSecret string) *terracev1.Stack {
	src := req.GetSource()
	stack := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: req.GetName(), Labels: map[string]string{InstallationLabel: "true"}},
		Spec: terracev1.StackSpec{
			Source:               terracev1.StackSource{URL: src.GetUrl(), Digest: src.GetDigest()},
			Path:                 req.GetPath(),
			VarsFrom:             []terracev1.VarsReference{{Kind: "Secret", Name: valuesSecret}},
			ApprovePlan:          req.GetApprovePlan(),
			WriteOutputsToSecret: &terracev1.OutputsSecret{Name: req.GetName() + outputsSuffix},
		},
	}
	if src.GetProgramRef() != "" {
		stack.Spec.Source.ProgramRef = &terracev1.LocalObjectReference{Name: src.GetProgramRef()}
	}
	return stack
}

// newValuesSecret is an installation's values Secret, marked as Terrace's;
// ownValues (or the caller) binds it to the Stack. A new installation's has
// a generated name (<installation>-values-<random>), so it never meets a
// Secret someone else made.
func (s *site) newValuesSecret(installation string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, GenerateName: installation + valuesSuffix + "-", Labels: map[string]string{
			InstallationLabel:        "true",
			ownership.LabelManagedBy: ownership.ManagedByTerrace,
			ownership.LabelComponent: ownership.ComponentValues,
		}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// valuesConflict is the answer when the Secret the Stack reads its values
// from is not the one Terrace created for it: it is never written.
func (s *site) valuesConflict(installation string, secret *corev1.Secret) error {
	return failure(connect.CodeFailedPrecondition, reasonForeignSecret, fmt.Sprintf("Secret %s in namespace %s was not created by Terrace for installation %s (%s), so Terrace leaves it untouched: "+
		"write the values into that Secret yourself, or delete the installation and create it again", secret.Name, s.Namespace, installation, ownership.Describe(secret)))
}

// create makes the values Secret (a generated name) immediately before the
// Stack reading it, then makes the Stack own the Secret. If the Stack is not
// made, or cannot be made its owner, the Secret is deleted again (and a
// Stack that reads it, whose creation may have gone through unseen);
// nothing of a failed create stays behind. With values_secret the Stack
// reads an existing Secret, which Terrace neither owns nor deletes.
func (s *site) create(ctx context.Context, _ *call, req *apiv1.CreateRequest) (*apiv1.Installation, error) {
	if err := validateCreate(req); err != nil {
		return nil, invalid(err.Error())
	}
	data, err := valuesData(req.GetValues())
	if err != nil {
		return nil, err
	}
	existing := req.GetValuesSecret()
	// A dry run first: the schema's, RBAC's or a webhook's refusal, or an
	// existing Stack, leave nothing behind (a placeholder name stands in
	// for the generated one).
	placeholder := existing
	if placeholder == "" {
		placeholder = req.GetName() + valuesSuffix + "-dryrun"
	}
	if err := s.Caller.Create(ctx, s.newStack(req, placeholder), client.DryRunAll); err != nil {
		return nil, kubeError(err, "Stack "+req.GetName())
	}
	if err := s.outputsNameFree(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if existing != "" {
		if err := s.Caller.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: existing}, &corev1.Secret{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, failure(connect.CodeFailedPrecondition, reasonNotFound, fmt.Sprintf("valuesSecret %s does not exist in namespace %s: create it first, or send values instead", existing, s.Namespace))
			}
			return nil, kubeError(err, "Secret "+existing)
		}
		stack := s.newStack(req, existing)
		if err := s.Caller.Create(ctx, stack); err != nil {
			return nil, kubeError(err, "Stack "+req.GetName())
		}
		return installationOf(stack), nil
	}

	secret := s.newValuesSecret(req.GetName(), data)
	if err := s.Caller.Create(ctx, secret); err != nil {
		return nil, kubeError(err, "the values Secret of installation "+req.GetName())
	}
	stack := s.newStack(req, secret.Name)
	if err := s.Caller.Create(ctx, stack); err != nil {
		s.undoStackReading(ctx, req.GetName(), secret.Name)
		s.undo(ctx, secret)
		return nil, kubeError(err, "Stack "+req.GetName())
	}
	if err := s.ownValues(ctx, stack, secret); err != nil {
		s.undo(ctx, stack)
		s.undo(ctx, secret)
		return nil, err
	}
	return installationOf(stack), nil
}

// undoStackReading deletes the Stack named installation if it reads the
// values Secret secretName: its create answered with an error (a timeout)
// but may have been done. The generated Secret name makes such a Stack this
// request's, and no one else's.
func (s *site) undoStackReading(callCtx context.Context, installation, secretName string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(callCtx), 10*time.Second)
	defer cancel()
	stack := &terracev1.Stack{}
	if err := s.Caller.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: installation}, stack); err != nil {
		return
	}
	if slices.ContainsFunc(stack.Spec.VarsFrom, func(v terracev1.VarsReference) bool { return v.Kind == "Secret" && v.Name == secretName }) {
		s.undo(ctx, stack)
	}
}

// outputsNameFree refuses a new installation whose outputs Secret name is
// taken: its Stack would stall with OutputsSecretConflict.
func (s *site) outputsNameFree(ctx context.Context, installation string) error {
	name := installation + outputsSuffix
	err := s.Caller.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, &corev1.Secret{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsForbidden(err):
		// A caller who may not read Secrets cannot be told; the Stack
		// would then stall with OutputsSecretConflict, which says so.
		return nil
	case err != nil:
		return kubeError(err, "Secret "+name)
	}
	return failure(connect.CodeAlreadyExists, reasonForeignSecret, fmt.Sprintf("Secret %s already exists in namespace %s; the installation would write its outputs there, which Terrace never does to a Secret it did not create: delete or rename it, or choose another installation name", name, s.Namespace))
}

// ownValues binds the values Secret to the Stack (controller reference), so
// deleting the Stack deletes it and the controller knows it as this Stack's.
func (s *site) ownValues(ctx context.Context, stack *terracev1.Stack, secret *corev1.Secret) error {
	before := secret.DeepCopy()
	if err := ownership.Claim(secret, stack, ownership.ComponentValues, s.Caller.Scheme()); err != nil {
		return err
	}
	// The patch carries the resourceVersion of the Secret created above.
	if err := s.Caller.Patch(ctx, secret, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return kubeError(err, fmt.Sprintf("making Stack %s the owner of Secret %s", stack.Name, secret.Name))
	}
	return nil
}

// undo deletes an object a failed create made, as the caller, on its own
// deadline: the request's may be what ran out.
func (s *site) undo(callCtx context.Context, obj client.Object) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(callCtx), 10*time.Second)
	defer cancel()
	// Only the object this request made: the UID precondition spares one
	// put in its place since.
	uid := obj.GetUID()
	err := s.Caller.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) {
		s.Log.Error(err, "failed to remove an object of a failed create", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName())
	}
}

// maxPageSize bounds a List page (and is the default).
const maxPageSize = 500

// list pages through the installations with the Kubernetes API's own
// continue tokens; Stacks come back ordered by name.
func (s *site) list(ctx context.Context, req *apiv1.ListRequest) (*apiv1.ListResponse, error) {
	size := int64(req.GetPageSize())
	if size < 0 {
		return nil, invalid("pageSize must not be negative")
	}
	if size == 0 || size > maxPageSize {
		size = maxPageSize
	}
	stacks := &terracev1.StackList{}
	err := s.Caller.List(ctx, stacks, client.InNamespace(s.Namespace), client.MatchingLabels{InstallationLabel: "true"},
		client.Limit(size), client.Continue(req.GetPageToken()))
	switch {
	case apierrors.IsResourceExpired(err), apierrors.IsBadRequest(err) && req.GetPageToken() != "":
		return nil, invalid("pageToken is not valid or has expired: list again from the first page")
	case err != nil:
		return nil, kubeError(err, "Stacks")
	}
	out := &apiv1.ListResponse{Items: make([]*apiv1.Installation, 0, len(stacks.Items)), NextPageToken: stacks.Continue}
	for i := range stacks.Items {
		out.Items = append(out.Items, installationOf(&stacks.Items[i]))
	}
	return out, nil
}

// delete deletes the Stack; its finalizer destroys the resources when
// destroyOnDelete is set, and the values Secret goes with it.
func (s *site) delete(ctx context.Context, c *call) (*apiv1.Installation, error) {
	stack, err := s.installation(ctx, c.name)
	if err != nil {
		return nil, err
	}
	err = s.Caller.Delete(ctx, stack, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: &stack.UID})
	if err != nil {
		return nil, kubeError(err, "Stack "+c.name)
	}
	in := installationOf(stack)
	in.Deleting = true
	in.Phase = phaseDeleting
	return in, nil
}

// updateValues replaces the values Secret; the Stack plans again because the
// Secret's version is part of its inputs.
func (s *site) updateValues(ctx context.Context, c *call, req *apiv1.UpdateValuesRequest) (*apiv1.Installation, error) {
	if req.GetValues() == nil {
		return nil, invalid(`the body must be {"values": {...}}; send {"values": {}} to clear every value`)
	}
	if err := validateValues(req.GetValues()); err != nil {
		return nil, invalid(err.Error())
	}
	data, err := valuesData(req.GetValues())
	if err != nil {
		return nil, err
	}
	stack, err := s.installation(ctx, c.name)
	if err != nil {
		return nil, err
	}
	name := valuesSecretOf(stack)
	if name == "" {
		return nil, failure(connect.CodeFailedPrecondition, reasonForeignSecret, fmt.Sprintf("Stack %s reads its values from no Secret (spec.varsFrom was changed): edit the Stack instead", c.name))
	}
	secret := &corev1.Secret{}
	err = s.Caller.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		// The Stack's values Secret was deleted: made again under its name, owned.
		secret = s.newValuesSecret(c.name, data)
		secret.GenerateName, secret.Name = "", name
		if err := ownership.Claim(secret, stack, ownership.ComponentValues, s.Caller.Scheme()); err != nil {
			return nil, err
		}
		if err := s.Caller.Create(ctx, secret); err != nil {
			return nil, kubeError(err, "Secret "+name)
		}
	case err != nil:
		return nil, kubeError(err, "Secret "+name)
	case !ownership.Owns(secret, stack, ownership.ComponentValues):
		return nil, s.valuesConflict(c.name, secret)
	default:
		secret.Data = data
		secret.StringData = nil
		// Update carries the resourceVersion read: a concurrent change is a conflict, not lost.
		if err := s.Caller.Update(ctx, secret); err != nil {
			return nil, kubeError(err, "Secret "+name)
		}
	}
	return installationOf(stack), nil
}

// valuesSecretOf is the Secret an installation reads its values from: the
// first Secret of its varsFrom.
func valuesSecretOf(stack *terracev1.Stack) string {
	for _, v := range stack.Spec.VarsFrom {
		if v.Kind == "Secret" {
			return v.Name
		}
	}
	return ""
}

// stack reads the named Stack of the site's namespace, an installation or not.
func (s *site) stack(ctx context.Context, name string) (*terracev1.Stack, error) {
	stack := &terracev1.Stack{}
	if err := s.Caller.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, stack); err != nil {
		return nil, kubeError(err, "Stack "+name+" in namespace "+s.Namespace)
	}
	return stack, nil
}

// installation reads the named Stack, which must carry the installation
// label: the calls that manage what Create made (the values Secret, the
// deletion) serve nothing else.
func (s *site) installation(ctx context.Context, name string) (*terracev1.Stack, error) {
	stack, err := s.stack(ctx, name)
	if err != nil {
		return nil, err
	}
	if stack.Labels[InstallationLabel] != "true" {
		return nil, failure(connect.CodeNotFound, reasonNotAnInstallation, fmt.Sprintf("Stack %s in namespace %s is not an installation (it has no %s=true label)", name, s.Namespace, InstallationLabel))
	}
	return stack, nil
}
