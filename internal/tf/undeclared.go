package tf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrUndeclaredVariable marks a command refused or failed because the
// caller set variables the root module does not declare.
var ErrUndeclaredVariable = errors.New("undeclared variable")

// UndeclaredVariableError names the variables set by the caller that the
// module does not declare. Cause, when set, is the command's own failure
// (typically tofu's "No value for required variable"), which an undeclared
// name explains.
type UndeclaredVariableError struct {
	Names    []string
	Declared []string
	Cause    error
}

func (e *UndeclaredVariableError) Is(target error) bool { return target == ErrUndeclaredVariable }
func (e *UndeclaredVariableError) Unwrap() error        { return e.Cause }

func (e *UndeclaredVariableError) Error() string {
	var b strings.Builder
	if e.Cause != nil {
		b.WriteString(e.Cause.Error())
		b.WriteString("; ")
	}
	quoted := make([]string, len(e.Names))
	for i, n := range e.Names {
		quoted[i] = fmt.Sprintf("%q", n)
	}
	fmt.Fprintf(&b, "the Stack's vars/varsFrom set %s, which the module does not declare (it declares %s)",
		strings.Join(quoted, ", "), declaredList(e.Declared))
	if slices.ContainsFunc(e.Names, isYAMLBoolean) {
		b.WriteString(": YAML reads an unquoted key n, no, off or false as \"false\" (y, yes, on, true as \"true\"); " +
			"quote the key in the Stack or its ConfigMap/Secret, e.g. \"n\": 3")
	} else {
		b.WriteString(": correct the name, or select keys with varsFrom[].keys")
	}
	return b.String()
}

func declaredList(names []string) string {
	switch {
	case len(names) == 0:
		return "no variables"
	case len(names) > 10:
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}

// isYAMLBoolean spots a key YAML 1.1 made from an unquoted n, y, yes, no,
// on, off: no module declares a variable called true or false on purpose.
func isYAMLBoolean(name string) bool { return name == "true" || name == "false" }

// undeclaredVariables returns the names in the caller's values the root
// module does not declare, sorted, and the declared names; nothing when a
// configuration file does not parse (tofu reports that itself).
func (e *Executor) undeclaredVariables(vars Variables) (undeclared, declared []string) {
	values := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(vars.JSON)) == 0 || json.Unmarshal(vars.JSON, &values) != nil {
		return nil, nil
	}
	decls, complete := parseVariableBlocks(e.moduleDir)
	if !complete {
		return nil, nil
	}
	for name := range values {
		if _, ok := decls[name]; !ok {
			undeclared = append(undeclared, name)
		}
	}
	for name := range decls {
		declared = append(declared, name)
	}
	slices.Sort(undeclared)
	slices.Sort(declared)
	return undeclared, declared
}

// checkDeclared refuses, before tofu runs, a true/false key the module does
// not declare: tofu would only warn and use the variable's default, losing
// the user's value silently.
func checkDeclared(undeclared, declared []string) error {
	if slices.ContainsFunc(undeclared, isYAMLBoolean) {
		return &UndeclaredVariableError{Names: undeclared, Declared: declared}
	}
	return nil
}

// explainUndeclared adds the undeclared names to a command's failure when
// tofu missed a required value: the likely cause is a misspelt or
// YAML-mangled key. Other failures pass unchanged.
func explainUndeclared(err error, undeclared, declared []string) error {
	var cmdErr *CommandError
	if len(undeclared) == 0 || !errors.As(err, &cmdErr) || !strings.Contains(cmdErr.Message, "No value for required variable") {
		return err
	}
	return &UndeclaredVariableError{Names: undeclared, Declared: declared, Cause: err}
}

// commandVariables prepares a command's var files (prepareVariables) and
// refuses, before tofu runs, values the module does not declare
// (checkDeclared). explain names those values in the command's error.
// cleanup removes the written var file once the command is done.
func (e *Executor) commandVariables(vars Variables) (files []string, cleanup func(), explain func(error) error, err error) {
	files, cleanup, err = e.prepareVariables(vars)
	if err != nil {
		return nil, nil, nil, err
	}
	undeclared, declared := e.undeclaredVariables(vars)
	if err := checkDeclared(undeclared, declared); err != nil {
		cleanup()
		return nil, nil, nil, err
	}
	return files, cleanup, func(err error) error { return explainUndeclared(err, undeclared, declared) }, nil
}
