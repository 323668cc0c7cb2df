package tf

import (
	"bytes"
	"strings"
	"sync"
	"unicode/utf8"
)

// maxLinePiece bounds one emitted log line; a longer line is redacted
// whole and then cut into pieces, so each message stays small and no
// secret is split across pieces before redaction.
const maxLinePiece = 64 << 10

// maxPendingLine bounds the bytes held while waiting for a newline.
const maxPendingLine = 32 << 20

// lineSplitter cuts written bytes into lines, without their newline, and
// hands each to line (under its lock, so lines arrive one at a time).
type lineSplitter struct {
	mu   sync.Mutex
	buf  []byte
	line func([]byte)
}

func (w *lineSplitter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) >= maxPendingLine {
		w.line(w.buf)
		w.buf = nil
	}
	return len(p), nil
}

// Flush hands on a last line without newline.
func (w *lineSplitter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = nil
	}
}

// lineWriter splits written bytes into lines, redacts each and hands it on.
type lineWriter struct {
	lineSplitter
	redactor *Redactor
	emit     func(string)
}

func newLineWriter(r *Redactor, emit func(string)) *lineWriter {
	w := &lineWriter{redactor: r, emit: emit}
	w.line = w.emitLine
	return w
}

func (w *lineWriter) emitLine(line []byte) {
	// Log lines travel as protobuf strings, which must be valid UTF-8.
	text := strings.ToValidUTF8(w.redactor.String(string(bytes.TrimRight(line, "\r"))), "\uFFFD")
	for len(text) > maxLinePiece {
		cut := maxLinePiece
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		w.emit(text[:cut])
		text = text[cut:]
	}
	w.emit(text)
}
