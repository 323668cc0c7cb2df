package tf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// uiStream reads tofu's machine-readable UI (`plan -json`): it counts the
// plan's changes from its change_summary, resource_drift and outputs
// messages, so the summary needs no parse of the whole plan, and it passes
// each message on as the line a person would read (its @message, or a
// diagnostic rendered as tofu prints it), redacted by out. Lines that are
// not JSON pass as they are.
type uiStream struct {
	lineSplitter
	out *lineWriter

	mu      sync.Mutex
	summary Summary
	// version is the tool's version, from the stream's first message.
	version string
	// onPlanned, when set, is called once, when an apply's stream moves
	// from its plan to the apply (see planDone).
	onPlanned func()
	planFired bool
	// errors are the error diagnostics, rendered, for the command's error.
	errors []string
}

func newUIStream(out *lineWriter) *uiStream {
	s := &uiStream{out: out}
	s.lineSplitter.line = s.line
	return s
}

// Flush handles a last line without newline.
func (s *uiStream) Flush() {
	s.lineSplitter.Flush()
	s.out.Flush()
}

// uiMessage is the part of a UI message the runner reads.
type uiMessage struct {
	Type    string `json:"type"`
	Level   string `json:"@level"`
	Message string `json:"@message"`
	Changes *struct {
		Add, Change, Import, Remove, Forget int
		// Operation is "plan", or "apply" for what an apply did.
		Operation string
	} `json:"changes"`
	Tofu      string `json:"tofu"`
	Terraform string `json:"terraform"`
	Change    *struct {
		Action string `json:"action"`
	} `json:"change"`
	Outputs    map[string]struct{ Action string } `json:"outputs"`
	Diagnostic *uiDiagnostic                      `json:"diagnostic"`
}

type uiDiagnostic struct {
	Severity string `json:"severity"`
	Summary  string `json:"summary"`
	Detail   string `json:"detail"`
	Address  string `json:"address"`
	Range    *struct {
		Filename string `json:"filename"`
		Start    struct {
			Line int `json:"line"`
		} `json:"start"`
	} `json:"range"`
	Snippet *struct {
		Context   *string `json:"context"`
		Code      string  `json:"code"`
		StartLine int     `json:"start_line"`
	} `json:"snippet"`
}

func (s *uiStream) line(raw []byte) {
	raw = bytes.TrimRight(raw, "\r")
	var m uiMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &m) != nil || m.Type == "" {
		s.emit(string(raw))
		return
	}
	if !s.planned() && applyPhase(&m) {
		s.planDone()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch m.Type {
	case "diagnostic":
		if m.Diagnostic != nil {
			text := m.Diagnostic.render()
			if m.Diagnostic.Severity == "error" {
				s.errors = append(s.errors, text)
			}
			s.emit(text)
			return
		}
	case "version":
		s.version = m.Tofu
		if s.version == "" {
			s.version = m.Terraform
		}
	case "change_summary":
		// An apply's stream has the plan's summary, then the apply's.
		if c := m.Changes; c != nil && (c.Operation == "" || c.Operation == "plan") {
			s.summary.Add, s.summary.Change, s.summary.Destroy = c.Add, c.Change, c.Remove
			s.summary.Import, s.summary.Forget = c.Import, c.Forget
		}
	case "resource_drift":
		if m.Change != nil && m.Change.Action != "noop" {
			s.summary.Drift++
		}
	case "outputs":
		if !plannedOutputs(m.Outputs) {
			break // an apply's closing list of values, without actions
		}
		s.summary.OutputChanges = 0
		for _, o := range m.Outputs {
			if o.Action != "" && o.Action != "noop" {
				s.summary.OutputChanges++
			}
		}
	}
	s.emit(m.Message)
}

// plannedOutputs says an outputs message is the plan's: its outputs have
// actions (an apply ends with one that lists values instead).
func plannedOutputs(outputs map[string]struct{ Action string }) bool {
	for _, o := range outputs {
		if o.Action != "" {
			return true
		}
	}
	return false
}

func (s *uiStream) emit(text string) {
	_, _ = s.out.Write([]byte(text + "\n"))
}

// render prints a diagnostic the way tofu's human view does.
func (d *uiDiagnostic) render() string {
	var b strings.Builder
	severity := "Warning"
	if d.Severity == "error" {
		severity = "Error"
	}
	fmt.Fprintf(&b, "%s: %s\n", severity, d.Summary)
	if r := d.Range; r != nil && r.Filename != "" {
		fmt.Fprintf(&b, "\n  on %s line %d", r.Filename, r.Start.Line)
		if sn := d.Snippet; sn != nil && sn.Context != nil && *sn.Context != "" {
			fmt.Fprintf(&b, ", in %s", *sn.Context)
		}
		b.WriteString(":\n")
		if sn := d.Snippet; sn != nil && sn.Code != "" {
			for i, code := range strings.Split(sn.Code, "\n") {
				fmt.Fprintf(&b, "  %d: %s\n", sn.StartLine+i, code)
			}
		}
	}
	if d.Detail != "" {
		fmt.Fprintf(&b, "\n%s\n", d.Detail)
	}
	return strings.TrimRight(b.String(), "\n")
}

// errorText is the error diagnostics, for the command's error.
func (s *uiStream) errorText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.errors, "\n\n")
}

// planDone marks the plan complete, calling onPlanned the first time.
func (s *uiStream) planDone() {
	s.mu.Lock()
	fired := s.planFired
	s.planFired = true
	s.mu.Unlock()
	if !fired && s.onPlanned != nil {
		s.onPlanned()
	}
}

// planned says the plan was complete before the stream ended.
func (s *uiStream) planned() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.planFired
}

// toolVersion is the version the stream's first message named.
func (s *uiStream) toolVersion() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// result is the summary counted from the stream.
func (s *uiStream) result() Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.summary
}
