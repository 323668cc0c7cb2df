package nesting

import (
	"github.com/apparentlymart/go-textseg/v15/textseg"
	"github.com/hashicorp/hcl/v2"
)

// checkJSON counts [ and { outside strings. HCL's JSON lexer is not
// exported, so its one rule that matters here is repeated exactly: where a
// string ends. It ends at an unescaped quote or before a control byte, and
// it advances a grapheme cluster at a time, so a quote that joins the
// cluster before it (after a Unicode "prepend" character, say) does not
// end it. A scanner that ended strings at every quote would read the rest
// of such a file inside out, strings as brackets and brackets as strings.
// Line and column are counted as HCL counts them, for the message.
func checkJSON(src []byte, filename string, limit int) error {
	var stack []byte
	pos := hcl.InitialPos
	for i := 0; i < len(src); {
		switch b := src[i]; b {
		case '"':
			n, cols := jsonStringLen(src[i:])
			i += n
			pos.Byte += n
			pos.Column += cols
			continue
		case '[', '{':
			if len(stack) == limit {
				return &Error{Filename: filename, Pos: pos, Limit: limit}
			}
			stack = append(stack, b)
		case ']', '}':
			// A closer that does not match is left alone, as in checkHCL.
			if n := len(stack); n > 0 && stack[n-1] == opening(b) {
				stack = stack[:n-1]
			}
		}
		switch src[i] {
		case '\n':
			pos.Line++
			pos.Column = 1
		case '\r':
		case '\t':
			pos.Column += 2
		default:
			pos.Column++
		}
		pos.Byte++
		i++
	}
	return nil
}

func opening(closer byte) byte {
	if closer == ']' {
		return '['
	}
	return '{'
}

// jsonStringLen is how many bytes and columns the string token at the
// start of buf takes, as hcl/json's scanString reads it.
func jsonStringLen(buf []byte) (n, cols int) {
	i, cols := 1, 1
	escaping := false
	for i < len(buf) {
		b := buf[i]
		switch {
		case b == '\\':
			escaping = !escaping
			i++
			cols++
		case b == '"':
			i++
			cols++
			if !escaping {
				return i, cols
			}
			escaping = false
		case b < 32:
			return i, cols
		default:
			advance, _, _ := textseg.ScanGraphemeClusters(buf[i:], true)
			i += advance
			cols++
			escaping = false
		}
	}
	return i, cols
}
