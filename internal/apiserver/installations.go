package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/ownership"
)

const (
	valuesSuffix  = "-values"
	outputsSuffix = "-outputs"
)

var (
	// variableName is an OpenTofu variable identifier, also a valid Secret key.
	variableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)
	digestForm   = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
)

// validateName checks a Kubernetes object name that must also leave room
// for the -values and -outputs Secrets.
func validateName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s is required", what)
	}
	if problems := validation.IsDNS1123Subdomain(name); len(problems) > 0 {
		return fmt.Errorf("%s %q is not valid: %s", what, name, strings.Join(problems, "; "))
	}
	if limit := validation.DNS1123SubdomainMaxLength - len(outputsSuffix); len(name) > limit {
		return fmt.Errorf("%s %q is longer than %d characters", what, name, limit)
	}
	return nil
}

// validate checks what can be checked before asking the API server, which
// enforces the Stack schema itself.
func (req *CreateRequest) validate() error {
	if err := validateName("name", req.Name); err != nil {
		return err
	}
	src := req.Source
	switch {
	case src.SourceRef != "":
		return errors.New("source.sourceRef cannot be set through the API: use source.programRef or source.url with source.digest")
	case (src.ProgramRef != "") == (src.URL != ""):
		return errors.New("source needs exactly one of programRef (a Program of this namespace) and url (a tar.gz, with digest)")
	case src.ProgramRef != "" && src.Digest != "":
		return errors.New("source.digest is only used with source.url")
	case src.ProgramRef != "":
		if err := validateProgramRef(src.ProgramRef); err != nil {
			return err
		}
	case !strings.HasPrefix(src.URL, "https://") && !strings.HasPrefix(src.URL, "http://"):
		return errors.New("source.url must start with https:// or http://")
	case !digestForm.MatchString(src.Digest):
		return errors.New("source.digest must be sha256:<64 lowercase hex digits> of the tarball at source.url")
	}
	if req.ApprovePlan != "" && req.ApprovePlan != terracev1.ApprovePlanAuto {
		return errors.New("approvePlan may be \"auto\" or empty at creation; approve a plan later with POST /v1/installations/{name}/approve")
	}
	return validateValues(req.Values)
}

func validateProgramRef(name string) error {
	if problems := validation.IsDNS1123Subdomain(name); len(problems) > 0 {
		return fmt.Errorf("source.programRef %q is not a valid Program name: %s", name, strings.Join(problems, "; "))
	}
	return nil
}

func validateValues(values map[string]json.RawMessage) error {
	for name := range values {
		if !variableName.MatchString(name) {
			return fmt.Errorf("values: %q is not a variable name (letters, digits, _ and -, not starting with a digit)", name)
		}
	}
	return nil
}

// valuesData stores each value as compact JSON: the Stack parses a valid
// JSON value as JSON, so strings keep their quotes and stay strings.
func valuesData(values map[string]json.RawMessage) (map[string][]byte, error) {
	data := make(map[string][]byte, len(values))
	for name, raw := range values {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, badRequest(fmt.Sprintf("values: %q is not valid JSON", name))
		}
		data[name] = buf.Bytes()
	}
	return data, nil
}

// newStack builds the Stack of an installation.
func (s *Server) newStack(req *CreateRequest) *terracev1.Stack {
	stack := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: req.Name, Labels: map[string]string{InstallationLabel: "true"}},
		Spec: terracev1.StackSpec{
			Source:               terracev1.StackSource{URL: req.Source.URL, Digest: req.Source.Digest},
			Path:                 req.Path,
			VarsFrom:             []terracev1.VarsReference{{Kind: "Secret", Name: req.Name + valuesSuffix}},
			ApprovePlan:          req.ApprovePlan,
			WriteOutputsToSecret: &terracev1.OutputsSecret{Name: req.Name + outputsSuffix},
		},
	}
	if req.Source.ProgramRef != "" {
		stack.Spec.Source.ProgramRef = &terracev1.LocalObjectReference{Name: req.Source.ProgramRef}
	}
	return stack
}

// newValuesSecret is an installation's values Secret, marked as Terrace's;
// ownValues (or the caller) binds it to the Stack.
func (s *Server) newValuesSecret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: name + valuesSuffix, Labels: map[string]string{
			InstallationLabel:        "true",
			ownership.LabelManagedBy: ownership.ManagedByTerrace,
			ownership.LabelComponent: ownership.ComponentValues,
		}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// valuesConflict is the answer when a Secret of the values name exists but
// Terrace did not create it for this installation: it is never written.
func (s *Server) valuesConflict(installation string, secret *corev1.Secret) error {
	return conflict(fmt.Sprintf("Secret %s in namespace %s was not created by Terrace for installation %s (%s), so Terrace leaves it untouched: "+
		"delete or rename that Secret and send the values again, or choose another installation name", secret.Name, s.Namespace, installation, ownership.Describe(secret)))
}

// create makes the values Secret, then the Stack reading it, then makes the
// Stack own the Secret; a failure on the way undoes what was made.
func (s *Server) create(ctx context.Context, c *call) error {
	var req CreateRequest
	if err := decodeBody(c.r, &req); err != nil {
		return err
	}
	if err := req.validate(); err != nil {
		return badRequest(err.Error())
	}
	data, err := valuesData(req.Values)
	if err != nil {
		return err
	}
	stack := s.newStack(&req)
	// A dry run first: the schema's refusal or an existing Stack leaves nothing behind.
	if err := s.Client.Create(ctx, stack.DeepCopy(), client.DryRunAll); err != nil {
		return kubeError(err, "Stack "+req.Name)
	}
	if err := s.outputsNameFree(ctx, req.Name); err != nil {
		return err
	}
	secret := s.newValuesSecret(req.Name, data)
	if err := s.Client.Create(ctx, secret); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return conflict(fmt.Sprintf("Secret %s already exists in namespace %s and Terrace did not create it for this installation, so Terrace leaves it untouched: delete or rename it, or choose another installation name", secret.Name, s.Namespace))
		}
		return kubeError(err, "Secret "+secret.Name)
	}
	if err := s.Client.Create(ctx, stack); err != nil {
		s.undo(secret)
		return kubeError(err, "Stack "+req.Name)
	}
	if err := s.ownValues(ctx, stack, secret); err != nil {
		s.undo(stack)
		s.undo(secret)
		return err
	}
	writeJSON(c.w, http.StatusCreated, installationOf(stack))
	return nil
}

// outputsNameFree refuses a new installation whose outputs Secret name is
// taken: its Stack would stall with OutputsSecretConflict.
func (s *Server) outputsNameFree(ctx context.Context, installation string) error {
	name := installation + outputsSuffix
	err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, &corev1.Secret{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return kubeError(err, "Secret "+name)
	}
	return conflict(fmt.Sprintf("Secret %s already exists in namespace %s; the installation would write its outputs there, which Terrace never does to a Secret it did not create: delete or rename it, or choose another installation name", name, s.Namespace))
}

// ownValues binds the values Secret to the Stack (controller reference), so
// deleting the Stack deletes it and the controller knows it as this Stack's.
func (s *Server) ownValues(ctx context.Context, stack *terracev1.Stack, secret *corev1.Secret) error {
	before := secret.DeepCopy()
	if err := ownership.Claim(secret, stack, ownership.ComponentValues, s.Client.Scheme()); err != nil {
		return err
	}
	// The patch carries the resourceVersion of the Secret created above.
	if err := s.Client.Patch(ctx, secret, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("failed to make Stack %s own Secret %s: %w", stack.Name, secret.Name, err)
	}
	return nil
}

// undo deletes an object a failed create made, on its own deadline: the
// request's may be what ran out.
func (s *Server) undo(obj client.Object) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Only the object this request made: the UID precondition spares one
	// put in its place since.
	uid := obj.GetUID()
	err := s.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) {
		s.Log.Error(err, "failed to remove an object of a failed create", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName())
	}
}

func (s *Server) list(ctx context.Context, c *call) error {
	stacks := &terracev1.StackList{}
	if err := s.Client.List(ctx, stacks, client.InNamespace(s.Namespace), client.MatchingLabels{InstallationLabel: "true"}); err != nil {
		return kubeError(err, "Stacks")
	}
	list := InstallationList{Items: make([]Installation, 0, len(stacks.Items))}
	for i := range stacks.Items {
		list.Items = append(list.Items, installationOf(&stacks.Items[i]))
	}
	slices.SortFunc(list.Items, func(a, b Installation) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(c.w, http.StatusOK, list)
	return nil
}

func (s *Server) get(ctx context.Context, c *call) error {
	stack, err := s.installation(ctx, c.name)
	if err != nil {
		return err
	}
	writeJSON(c.w, http.StatusOK, installationOf(stack))
	return nil
}

// delete deletes the Stack; its finalizer destroys the resources when
// destroyOnDelete is set, and the values Secret goes with it.
func (s *Server) delete(ctx context.Context, c *call) error {
	stack, err := s.installation(ctx, c.name)
	if err != nil {
		return err
	}
	err = s.Client.Delete(ctx, stack, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: &stack.UID})
	if err != nil {
		return kubeError(err, "Stack "+c.name)
	}
	in := installationOf(stack)
	in.Deleting = true
	writeJSON(c.w, http.StatusAccepted, in)
	return nil
}

// putValues replaces the values Secret; the Stack plans again because the
// Secret's version is part of its inputs.
func (s *Server) putValues(ctx context.Context, c *call) error {
	var req ValuesRequest
	if err := decodeBody(c.r, &req); err != nil {
		return err
	}
	if req.Values == nil {
		return badRequest(`the body must be {"values": {...}}; send {"values": {}} to clear every value`)
	}
	if err := validateValues(req.Values); err != nil {
		return badRequest(err.Error())
	}
	data, err := valuesData(req.Values)
	if err != nil {
		return err
	}
	stack, err := s.installation(ctx, c.name)
	if err != nil {
		return err
	}
	name := c.name + valuesSuffix
	if !slices.ContainsFunc(stack.Spec.VarsFrom, func(v terracev1.VarsReference) bool { return v.Kind == "Secret" && v.Name == name }) {
		return conflict(fmt.Sprintf("Stack %s no longer reads its values from Secret %s (spec.varsFrom was changed): edit the Stack instead", c.name, name))
	}
	secret := &corev1.Secret{}
	err = s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		if err := s.authorize(ctx, c.caller, access{verb: "create", resource: "secrets"}); err != nil {
			return err
		}
		secret = s.newValuesSecret(c.name, data)
		if err := ownership.Claim(secret, stack, ownership.ComponentValues, s.Client.Scheme()); err != nil {
			return err
		}
		if err := s.Client.Create(ctx, secret); err != nil {
			return kubeError(err, "Secret "+name)
		}
	case err != nil:
		return kubeError(err, "Secret "+name)
	case !ownership.Owns(secret, stack, ownership.ComponentValues):
		return s.valuesConflict(c.name, secret)
	default:
		secret.Data = data
		secret.StringData = nil
		// Update carries the resourceVersion read: a concurrent change is a conflict, not lost.
		if err := s.Client.Update(ctx, secret); err != nil {
			return kubeError(err, "Secret "+name)
		}
	}
	writeJSON(c.w, http.StatusOK, installationOf(stack))
	return nil
}

// installation reads the named Stack, which must carry the installation label.
func (s *Server) installation(ctx context.Context, name string) (*terracev1.Stack, error) {
	stack := &terracev1.Stack{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, stack); err != nil {
		return nil, kubeError(err, "installation "+name)
	}
	if stack.Labels[InstallationLabel] != "true" {
		return nil, notFound(fmt.Sprintf("Stack %s in namespace %s is not an installation (it has no %s=true label)", name, s.Namespace, InstallationLabel))
	}
	return stack, nil
}

// kubeError turns an error of the Kubernetes API into the caller's answer.
// Messages of refused input are passed on: they name the field and the rule.
func kubeError(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return notFound(what + " not found")
	case apierrors.IsAlreadyExists(err):
		return conflict(what + " already exists")
	case apierrors.IsConflict(err):
		return conflict(what + " changed while this request ran: read it again and retry")
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return badRequest(err.Error())
	case apierrors.IsForbidden(err):
		// The server's own identity lacks a permission: the deployment's RBAC is wrong.
		return fmt.Errorf("the API server's own identity was refused access to %s (check its RBAC): %w", what, err)
	}
	return fmt.Errorf("failed to access %s: %w", what, err)
}
