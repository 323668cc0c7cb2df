package apiserver

// What a Create or UpdateValues request must satisfy before anything is written.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/util/validation"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
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
	// The longest name made from it is the values Secret's, <name>-values-<5 random>.
	if limit := validation.DNS1123SubdomainMaxLength - len(valuesSuffix+"-xxxxx"); len(name) > limit {
		return fmt.Errorf("%s %q is longer than %d characters", what, name, limit)
	}
	return nil
}

// validateCreate checks what can be checked before asking the API server,
// which enforces the Stack schema itself.
func validateCreate(req *apiv1.CreateRequest) error {
	if err := validateName("name", req.GetName()); err != nil {
		return err
	}
	src := req.GetSource()
	switch {
	case src.GetSourceRef() != "":
		return errors.New("source.sourceRef cannot be set through the API: use source.programRef or source.url with source.digest")
	case (src.GetProgramRef() != "") == (src.GetUrl() != ""):
		return errors.New("source needs exactly one of programRef (a Program of this namespace) and url (a tar.gz, with digest)")
	case src.GetProgramRef() != "" && src.GetDigest() != "":
		return errors.New("source.digest is only used with source.url")
	case src.GetProgramRef() != "":
		if err := validateProgramRef(src.GetProgramRef()); err != nil {
			return err
		}
	case !strings.HasPrefix(src.GetUrl(), "https://") && !strings.HasPrefix(src.GetUrl(), "http://"):
		return errors.New("source.url must start with https:// or http://")
	case !digestForm.MatchString(src.GetDigest()):
		return errors.New("source.digest must be sha256:<64 lowercase hex digits> of the tarball at source.url")
	}
	if req.GetApprovePlan() != "" && req.GetApprovePlan() != terracev1.ApprovePlanAuto {
		return errors.New("approvePlan may be \"auto\" or empty at creation; approve a plan later with POST /v1/installations/{name}/approve")
	}
	if v := req.GetValuesSecret(); v != "" {
		if len(req.GetValues().GetFields()) > 0 {
			return errors.New("send either values (Terrace keeps them in a Secret of its own) or valuesSecret (an existing Secret), not both")
		}
		if problems := validation.IsDNS1123Subdomain(v); len(problems) > 0 {
			return fmt.Errorf("valuesSecret %q is not a valid Secret name: %s", v, strings.Join(problems, "; "))
		}
	}
	return validateValues(req.GetValues())
}

func validateProgramRef(name string) error {
	if problems := validation.IsDNS1123Subdomain(name); len(problems) > 0 {
		return fmt.Errorf("source.programRef %q is not a valid Program name: %s", name, strings.Join(problems, "; "))
	}
	return nil
}

func validateValues(values *structpb.Struct) error {
	for name := range values.GetFields() {
		if !variableName.MatchString(name) {
			return fmt.Errorf("values: %q is not a variable name (letters, digits, _ and -, not starting with a digit)", name)
		}
	}
	return nil
}

// valuesData stores each value as compact JSON: the Stack parses a valid
// JSON value as JSON, so strings keep their quotes and stay strings.
func valuesData(values *structpb.Struct) (map[string][]byte, error) {
	data := make(map[string][]byte, len(values.GetFields()))
	for name, value := range values.GetFields() {
		raw, err := protojson.Marshal(value)
		if err != nil {
			return nil, invalid(fmt.Sprintf("values: %q cannot be written as JSON: %v", name, err))
		}
		// protojson's spacing is deliberately unstable; the Secret's is not.
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, fmt.Errorf("failed to compact value %q: %w", name, err)
		}
		data[name] = buf.Bytes()
	}
	return data, nil
}
