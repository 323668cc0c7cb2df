package nesting

import (
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// level is one open bracket, string, heredoc or template sequence.
type level struct {
	opener hclsyntax.TokenType
	// ops counts the operators of the expression under way at this level
	// (and the [*] splats, whose parser recurses for the traversal after
	// them); the expression ends at a comma, = or =>.
	ops int
	// directives counts the %{ if } and %{ for } open in this template.
	directives int
}

// checkHCL walks the tokens of hclsyntax's own lexer, the very tokens its
// parser reads, so a string, comment, heredoc or template sequence is
// exactly what the parser takes it to be; a scanner of our own that
// disagreed with it anywhere would let the rest of the file through
// unseen. The lexer is a state machine, without recursion. Every way the
// parser recurses adds a level here; a level ends only where the parser's
// recursion has surely returned (a closer that matches its opener, a
// comma, = or => for an expression's operators), so the count can only
// overstate the parser's depth, never understate it.
func checkHCL(src []byte, filename string, limit int) error {
	tokens, _ := hclsyntax.LexConfig(src, filename, hcl.InitialPos)
	stack := make([]level, 1, 16) // the file's body
	depth := 0
	prev := hclsyntax.TokenNil // the last token but comments and newlines
	for _, tok := range tokens {
		top := &stack[len(stack)-1]
		switch tok.Type {
		case hclsyntax.TokenOBrace, hclsyntax.TokenOBrack, hclsyntax.TokenOParen,
			hclsyntax.TokenOQuote, hclsyntax.TokenOHeredoc,
			hclsyntax.TokenTemplateInterp, hclsyntax.TokenTemplateControl:
			stack = append(stack, level{opener: tok.Type})
			depth++

		case hclsyntax.TokenCBrace, hclsyntax.TokenCBrack, hclsyntax.TokenCParen,
			hclsyntax.TokenCQuote, hclsyntax.TokenCHeredoc, hclsyntax.TokenTemplateSeqEnd:
			// A closer that does not match is left alone: the parser
			// reports it, and keeping the level open only overstates.
			if len(stack) > 1 && closes(top.opener, tok.Type) {
				depth -= 1 + top.ops + top.directives
				stack = stack[:len(stack)-1]
			}

		case hclsyntax.TokenStar:
			if prev == hclsyntax.TokenOBrack && len(stack) > 1 {
				// foo[*]: the splat's traversal is parsed one call deeper,
				// after this bracket has closed; it counts where foo is.
				stack[len(stack)-2].ops++
			} else {
				top.ops++
			}
			depth++

		case hclsyntax.TokenMinus, hclsyntax.TokenBang, hclsyntax.TokenQuestion,
			hclsyntax.TokenPlus, hclsyntax.TokenSlash, hclsyntax.TokenPercent,
			hclsyntax.TokenEqualOp, hclsyntax.TokenNotEqual,
			hclsyntax.TokenLessThan, hclsyntax.TokenLessThanEq,
			hclsyntax.TokenGreaterThan, hclsyntax.TokenGreaterThanEq,
			hclsyntax.TokenAnd, hclsyntax.TokenOr:
			top.ops++
			depth++

		case hclsyntax.TokenComma, hclsyntax.TokenEqual, hclsyntax.TokenFatArrow:
			depth -= top.ops
			top.ops = 0

		case hclsyntax.TokenIdent:
			// %{ if ... } and %{ for ... } open a directive of the template
			// around the sequence until %{ endif } / %{ endfor }.
			if prev == hclsyntax.TokenTemplateControl && len(stack) > 1 {
				template := &stack[len(stack)-2]
				switch string(tok.Bytes) {
				case "if", "for":
					template.directives++
					depth++
				case "endif", "endfor":
					if template.directives > 0 {
						template.directives--
						depth--
					}
				}
			}
		}
		if depth > limit {
			return &Error{Filename: filename, Pos: tok.Range.Start, Limit: limit}
		}
		if tok.Type != hclsyntax.TokenComment && tok.Type != hclsyntax.TokenNewline {
			prev = tok.Type
		}
	}
	return nil
}

// closes says whether closer ends a level opened by opener.
func closes(opener, closer hclsyntax.TokenType) bool {
	switch closer {
	case hclsyntax.TokenCBrace:
		return opener == hclsyntax.TokenOBrace
	case hclsyntax.TokenCBrack:
		return opener == hclsyntax.TokenOBrack
	case hclsyntax.TokenCParen:
		return opener == hclsyntax.TokenOParen
	case hclsyntax.TokenCQuote:
		return opener == hclsyntax.TokenOQuote
	case hclsyntax.TokenCHeredoc:
		return opener == hclsyntax.TokenOHeredoc
	case hclsyntax.TokenTemplateSeqEnd:
		return opener == hclsyntax.TokenTemplateInterp || opener == hclsyntax.TokenTemplateControl
	}
	return false
}
