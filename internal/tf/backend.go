package tf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Backend override files replace the module's backend block (override
// files merge into the module, a backend block in one replaces the
// module's whole block). One is written per Init, the other removed.
const (
	backendOverrideFile    = "terrace_backend_override.tf"
	ownBackendOverrideFile = "terrace_backend_override.tf.json"
	// backendCredentialsDir, under the work dir, holds asFile credentials.
	backendCredentialsDir = "backend-credentials"
)

// OwnBackend is a backend block of the Stack's own (spec.backend): the
// state lives there instead of on Terrace's state server.
type OwnBackend struct {
	// Type of the block, e.g. "pg"; never "local".
	Type string
	// Config is a JSON object of the block's attributes.
	Config json.RawMessage
	// Credentials are environment variables of every later command.
	Credentials []BackendCredential
}

// BackendCredential is one environment variable of tofu.
type BackendCredential struct {
	Env, Value string
	// AsFile writes Value to a 0600 file and sets Env to its path.
	AsFile bool
}

// The lengths are checked apart from the patterns: a counted repetition
// such as {0,127} compiles to that many copies, and compiling them took
// about 2 ms of every process's start (runner and controller alike).
var (
	backendTypePattern = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)        // at most maxBackendTypeLen
	envNamePattern     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) // at most maxEnvNameLen
)

const (
	maxBackendTypeLen = 32
	maxEnvNameLen     = 128
)

// configureBackend writes the backend override for opts in the module dir
// (or removes a stale one) and sets the environment later commands get.
func (e *Executor) configureBackend(dir string, opts InitOptions) error {
	e.backendEnv = nil
	keep := ""
	switch {
	case opts.HTTPBackend != nil && opts.OwnBackend != nil:
		return fmt.Errorf("%w: the http backend and an own backend exclude each other", ErrInvalidArgument)
	case opts.HTTPBackend != nil:
		keep = backendOverrideFile
		if err := e.configureHTTPBackend(dir, opts.HTTPBackend); err != nil {
			return err
		}
	case opts.OwnBackend != nil:
		keep = ownBackendOverrideFile
		if err := e.configureOwnBackend(dir, opts.OwnBackend); err != nil {
			return err
		}
	}
	for _, name := range []string{backendOverrideFile, ownBackendOverrideFile} {
		if name == keep {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("failed to remove the backend override: %w", err)
		}
	}
	return nil
}

// tofu retries a state request that got no answer or a 5xx stateRetryMax
// times, waiting from stateRetryWaitMin seconds, doubling, up to
// stateRetryWaitMax: 1, 2, 4 and 4 s, about 11 s in all, where tofu's
// defaults give up after 3 s.
const (
	stateRetryMax     = 4
	stateRetryWaitMin = 1
	stateRetryWaitMax = 4
)

func (e *Executor) configureHTTPBackend(dir string, b *HTTPBackend) error {
	if b.Address == "" {
		return fmt.Errorf("%w: the http backend needs an address", ErrInvalidArgument)
	}
	if err := os.WriteFile(filepath.Join(dir, backendOverrideFile), []byte("terraform {\n  backend \"http\" {}\n}\n"), 0o600); err != nil {
		return fmt.Errorf("failed to write the backend override: %w", err)
	}
	env := map[string]string{"TF_HTTP_ADDRESS": b.Address,
		// Ride through a short restart of the state server or of the
		// database behind it instead of failing the run.
		"TF_HTTP_RETRY_MAX":      strconv.Itoa(stateRetryMax),
		"TF_HTTP_RETRY_WAIT_MIN": strconv.Itoa(stateRetryWaitMin),
		"TF_HTTP_RETRY_WAIT_MAX": strconv.Itoa(stateRetryWaitMax),
	}
	for k, v := range map[string]string{
		"TF_HTTP_LOCK_ADDRESS": b.LockAddress, "TF_HTTP_UNLOCK_ADDRESS": b.UnlockAddress,
		"TF_HTTP_LOCK_METHOD": b.LockMethod, "TF_HTTP_UNLOCK_METHOD": b.UnlockMethod, "TF_HTTP_UPDATE_METHOD": b.UpdateMethod,
		"TF_HTTP_CLIENT_CERTIFICATE_PEM": string(b.ClientCertificatePEM), "TF_HTTP_CLIENT_PRIVATE_KEY_PEM": string(b.ClientKeyPEM),
		"TF_HTTP_CLIENT_CA_CERTIFICATE_PEM": string(b.CACertificatePEM),
	} {
		if v != "" {
			env[k] = v
		}
	}
	e.backendEnv = env
	return nil
}

// configureOwnBackend writes the block as a JSON override file: the
// attributes are data, so template sequences in strings are escaped.
func (e *Executor) configureOwnBackend(dir string, b *OwnBackend) error {
	if len(b.Type) > maxBackendTypeLen || !backendTypePattern.MatchString(b.Type) || b.Type == "local" {
		return fmt.Errorf("%w: backend type %q: name a remote backend (s3, gcs, azurerm, pg, http…)", ErrInvalidArgument, b.Type)
	}
	attrs := map[string]any{}
	if len(b.Config) > 0 {
		if err := json.Unmarshal(b.Config, &attrs); err != nil {
			return fmt.Errorf("%w: backend config is not a JSON object: %v", ErrInvalidArgument, err)
		}
	}
	override, err := json.Marshal(map[string]any{"terraform": map[string]any{"backend": map[string]any{b.Type: escapeTemplates(attrs)}}})
	if err != nil {
		return fmt.Errorf("failed to encode the backend override: %w", err)
	}
	env := map[string]string{}
	for _, c := range b.Credentials {
		if err := checkCredentialEnv(c.Env); err != nil {
			return err
		}
		value := c.Value
		if c.AsFile {
			path, err := e.writeCredentialFile(c)
			if err != nil {
				return err
			}
			value = path
		}
		e.redactor.Add(c.Value)
		env[c.Env] = value
	}
	if err := os.WriteFile(filepath.Join(dir, ownBackendOverrideFile), override, 0o600); err != nil {
		return fmt.Errorf("failed to write the backend override: %w", err)
	}
	e.backendEnv = env
	return nil
}

// checkCredentialEnv refuses variables Terrace sets itself.
func checkCredentialEnv(name string) error {
	if len(name) > maxEnvNameLen || !envNamePattern.MatchString(name) {
		return fmt.Errorf("%w: backend credential %q is not an environment variable name", ErrInvalidArgument, name)
	}
	reserved := strings.HasPrefix(name, "TF_") && !strings.HasPrefix(name, "TF_HTTP_")
	switch name {
	case "PATH", "HOME", "TMPDIR", "XDG_CONFIG_HOME", "CHECKPOINT_DISABLE", "PLUGIN_UNIX_SOCKET_DIR", "TERRAFORM_CONFIG":
		reserved = true
	}
	if reserved {
		return fmt.Errorf("%w: backend credential %s is set by Terrace", ErrInvalidArgument, name)
	}
	return nil
}

func (e *Executor) writeCredentialFile(c BackendCredential) (string, error) {
	dir := filepath.Join(e.cfg.WorkDir, backendCredentialsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("failed to create the backend credentials directory: %w", err)
	}
	path := filepath.Join(dir, c.Env)
	if err := os.WriteFile(path, []byte(c.Value), 0o600); err != nil {
		return "", fmt.Errorf("failed to write backend credential %s: %w", c.Env, err)
	}
	return path, nil
}

// escapeTemplates doubles "${" and "%{" in every string (keys too): HCL
// reads JSON strings as templates, and a backend block takes literals.
func escapeTemplates(v any) any {
	switch t := v.(type) {
	case string:
		return strings.NewReplacer("${", "$${", "%{", "%%{").Replace(t)
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = escapeTemplates(x)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[escapeTemplates(k).(string)] = escapeTemplates(x)
		}
		return out
	}
	return v
}
