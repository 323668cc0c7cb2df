package tf

import (
	"encoding/json"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// How a secret is found again, in free text and in JSON.
//
// Long secret text (minSecretLength or more) is replaced wherever it
// occurs, inside other words too: a long value is specific enough that a
// match is the secret.
//
// Short secret text ("ab", "7") and the text of numbers and booleans
// ("12345", "true") is replaced only as a whole token: where it is not
// preceded or followed by a letter, digit or underscore. Replacing every
// "a" or "1" inside other words would leave logs unreadable ("dat(sensitive
// value)") without hiding anything: the secret is wherever it stands alone,
// as tofu prints values (`+ pin = 7`, `"ab"`, `pin-7`). A short value made
// of punctuation only ("-", "..") cannot be told from the text around it
// and is not replaced in free text.
//
// In JSON (plans, outputs, records) the structure says where a value is,
// so values are compared whole: a number, boolean or string equal to a
// secret value is replaced, whatever its length; strings are also scrubbed
// as free text.

// maskedValues holds what a Redactor has learnt.
type maskedValues struct {
	// long are texts replaced wherever they occur.
	long map[string]struct{}
	// tokens are texts replaced where they stand alone, longest first.
	tokens    map[string]struct{}
	tokenList []string
	// exact are JSON scalars (scalarKey) replaced where they are a whole value.
	exact map[string]struct{}
}

func newMaskedValues() maskedValues {
	return maskedValues{long: map[string]struct{}{}, tokens: map[string]struct{}{}, exact: map[string]struct{}{}}
}

// scalarKey identifies a JSON scalar by value: numbers by their exact value
// (7, 7.0 and 7e0 are one), strings and booleans as they are. ok is false
// for anything else.
func scalarKey(v any) (key string, ok bool) {
	switch t := v.(type) {
	case string:
		return "s:" + t, true
	case bool:
		return "b:" + strconv.FormatBool(t), true
	case json.Number:
		if text, ok := canonicalNumber(string(t)); ok {
			return "n:" + text, true
		}
		return "n:" + string(t), true
	case float64:
		return "n:" + strconv.FormatFloat(t, 'f', -1, 64), true
	}
	return "", false
}

// canonicalNumber is a number's exact value in plain decimal, as tofu prints
// numbers ("1e3" → "1000", "7.50" → "7.5").
func canonicalNumber(text string) (string, bool) {
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return "", false
	}
	if r.IsInt() {
		return r.Num().String(), true
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'f', -1, 64), true
}

// textForms are the texts a secret value is printed as: strings as they
// are (and escaped), numbers as written and in plain decimal, booleans as
// true/false. long reports whether the forms may be replaced inside words.
func textForms(v any) (forms []string, long bool) {
	switch t := v.(type) {
	case string:
		forms = append(forms, t)
		forms = append(forms, jsonForms(t)...)
		if q := strconv.Quote(t); len(q) >= 2 {
			forms = append(forms, q[1:len(q)-1])
		}
		return forms, len(strings.TrimSpace(t)) >= minSecretLength
	case bool:
		return []string{strconv.FormatBool(t)}, false
	case json.Number:
		forms = append(forms, string(t))
		if c, ok := canonicalNumber(string(t)); ok {
			forms = append(forms, c)
		}
		return forms, false
	case float64:
		return []string{strconv.FormatFloat(t, 'f', -1, 64)}, false
	}
	return nil, false
}

// learn adds one scalar secret value; it reports whether anything was new.
func (m *maskedValues) learn(v any) bool {
	changed := false
	if key, ok := scalarKey(v); ok && key != "s:" {
		if _, seen := m.exact[key]; !seen {
			m.exact[key] = struct{}{}
			changed = true
		}
	}
	forms, long := textForms(v)
	for _, f := range forms {
		changed = m.learnText(f, long) || changed
	}
	// Each line of a multi-line secret is found on its own (logs are read
	// line by line); short lines ("}", "") are too common to replace.
	if s, ok := v.(string); ok && strings.Contains(s, "\n") {
		for _, line := range strings.Split(s, "\n") {
			if len(strings.TrimSpace(line)) >= minSecretLength {
				changed = m.learnText(line, true) || changed
			}
		}
	}
	return changed
}

func (m *maskedValues) learnText(f string, long bool) bool {
	if long && len(strings.TrimSpace(f)) >= minSecretLength {
		if _, ok := m.long[f]; ok {
			return false
		}
		m.long[f] = struct{}{}
		return true
	}
	if !strings.ContainsFunc(f, isWordRune) {
		return false
	}
	if _, ok := m.tokens[f]; ok {
		return false
	}
	m.tokens[f] = struct{}{}
	// A new slice: String reads the old one without holding the lock.
	m.tokenList = append(slices.Clone(m.tokenList), f)
	sort.Slice(m.tokenList, func(i, j int) bool {
		if len(m.tokenList[i]) != len(m.tokenList[j]) {
			return len(m.tokenList[i]) > len(m.tokenList[j])
		}
		return m.tokenList[i] < m.tokenList[j]
	})
	return true
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// maskTokens replaces each standalone occurrence of a token in s.
func maskTokens(s string, tokens []string) string {
	for _, tok := range tokens {
		if !strings.Contains(s, tok) {
			continue
		}
		var b strings.Builder
		i := 0
		for {
			j := strings.Index(s[i:], tok)
			if j < 0 {
				b.WriteString(s[i:])
				break
			}
			j += i
			end := j + len(tok)
			if standsAlone(s, j, end) {
				b.WriteString(s[i:j])
				b.WriteString(Redacted)
				i = end
				continue
			}
			// Not a whole token: keep one byte and look again from the next.
			_, size := utf8.DecodeRuneInString(s[j:])
			b.WriteString(s[i : j+size])
			i = j + size
		}
		s = b.String()
	}
	return s
}

// standsAlone reports whether s[start:end] is not glued to a letter, digit
// or underscore on a side where it itself begins or ends with one.
func standsAlone(s string, start, end int) bool {
	first, _ := utf8.DecodeRuneInString(s[start:end])
	last, _ := utf8.DecodeLastRuneInString(s[start:end])
	if start > 0 && isWordRune(first) {
		if before, _ := utf8.DecodeLastRuneInString(s[:start]); isWordRune(before) {
			return false
		}
	}
	if end < len(s) && isWordRune(last) {
		if after, _ := utf8.DecodeRuneInString(s[end:]); isWordRune(after) {
			return false
		}
	}
	return true
}

// maskJSON returns v (a JSON-decoded value, numbers as json.Number) with
// every scalar equal to a secret value replaced and every string and
// object key scrubbed as free text.
func (r *Redactor) maskJSON(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[r.String(k)] = r.maskJSON(e)
		}
		return out
	case []any:
		for i := range t {
			t[i] = r.maskJSON(t[i])
		}
		return t
	case nil:
		return nil
	}
	if r.isSecretScalar(v) {
		return Redacted
	}
	if s, ok := v.(string); ok {
		return r.String(s)
	}
	return v
}

func (r *Redactor) isSecretScalar(v any) bool {
	key, ok := scalarKey(v)
	if !ok {
		return false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, secret := r.values.exact[key]
	return secret
}

// ContainsSecret reports whether a JSON value holds a secret value: a
// scalar equal to one, or a string or key in which free-text scrubbing
// would replace something. Invalid JSON counts as containing one.
func (r *Redactor) ContainsSecret(raw json.RawMessage) bool {
	v, err := decodeJSON(raw)
	if err != nil {
		return true
	}
	return r.containsSecret(v)
}

func (r *Redactor) containsSecret(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if r.String(k) != k || r.containsSecret(e) {
				return true
			}
		}
		return false
	case []any:
		for _, e := range t {
			if r.containsSecret(e) {
				return true
			}
		}
		return false
	case nil:
		return false
	}
	if r.isSecretScalar(v) {
		return true
	}
	s, ok := v.(string)
	return ok && r.String(s) != s
}

// MarkSensitive names variables whose values must be redacted even if the
// module does not declare them sensitive (values from Secrets), for an
// executor that applies a plan it did not make: Apply reads their values
// from the plan file and masks them before tofu prints anything.
func (e *Executor) MarkSensitive(names []string) {
	for _, name := range names {
		if !e.extraSensitive[name] {
			// Plans learnt without this name must be learnt again.
			clear(e.learned)
		}
		e.extraSensitive[name] = true
	}
}
