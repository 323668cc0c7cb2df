package forge

import (
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Comment length limits of the forges, in characters.
const (
	// GitHubMaxComment: "Body is too long (maximum is 65536 characters)".
	GitHubMaxComment = 65536
	// GitLabMaxComment: GitLab's notes API refuses a body of 1,000,000
	// characters or more.
	GitLabMaxComment = 1000000 - 1
	// GiteaMaxComment: Gitea documents no limit (the column is a long
	// text); GitHub's is used, which keeps comments readable and within
	// what Forgejo accepts.
	GiteaMaxComment = 65536
)

// textLen counts s as forges count characters: in UTF-16 code units, which
// is never less than the count of runes.
func textLen(s string) int {
	n := 0
	for _, r := range s {
		if l := utf16.RuneLen(r); l > 0 {
			n += l
		} else {
			n++
		}
	}
	return n
}

// cutText keeps the longest prefix of s of at most n characters (textLen).
func cutText(s string, n int) string {
	used := 0
	for i, r := range s {
		l := utf16.RuneLen(r)
		if l < 0 {
			l = 1
		}
		if used+l > n {
			return s[:i]
		}
		used += l
	}
	return s
}

// TruncateComment cuts body at limit characters, ending it with a line that
// says so.
func TruncateComment(body string, limit int) string {
	body = strings.ToValidUTF8(body, "\uFFFD")
	if textLen(body) <= limit {
		return body
	}
	pointer := fmt.Sprintf("\n\n_… truncated at the forge's limit of %d characters._", limit)
	keep := limit - textLen(pointer)
	if keep < 0 {
		return cutText(body, limit)
	}
	return cutText(body, keep) + pointer
}

// PlanComment is what a Stack's comment on a pull request says.
type PlanComment struct {
	Namespace string
	Stack     string
	// Revision is the planned head, "<branch>@sha1:<hex>".
	Revision string
	// Status is Pending, Planned or Failed (the PullRequestPlan statuses).
	Status  string
	Add     int32
	Change  int32
	Destroy int32
	// Message says why the plan failed or what it waits for.
	Message string
	// Plan is the plan's text with sensitive values already masked.
	Plan string
	// DetailsURL links the plan in the console, when there is one.
	DetailsURL string
}

// RenderPlanComment renders c as Markdown of at most limit characters,
// starting with the Stack's marker. A plan too long for the limit is cut,
// with a line pointing at `terrace plan` and the console; the Markdown
// around it stays whole. Text that came from the module or the forge is
// put in code blocks fenced longer than any backtick run in it, so it
// cannot close the block and inject Markdown.
func RenderPlanComment(c PlanComment, limit int) string {
	ref := c.Namespace + "/" + c.Stack
	var head strings.Builder
	fmt.Fprintf(&head, "%s\n### Terrace plan of `%s`\n\n", Marker(c.Namespace, c.Stack), ref)
	switch c.Status {
	case "Failed":
		fmt.Fprintf(&head, "**Plan failed** for %s.\n", codeSpan(c.Revision))
	case "Pending":
		fmt.Fprintf(&head, "**Plan pending** for %s.\n", codeSpan(c.Revision))
	default:
		fmt.Fprintf(&head, "**Plan: +%d ~%d -%d** for %s.\n", c.Add, c.Change, c.Destroy, codeSpan(c.Revision))
	}
	if c.Message != "" {
		head.WriteString("\n" + codeBlock(clip(c.Message, 4096)))
	}
	if c.DetailsURL != "" && (strings.HasPrefix(c.DetailsURL, "https://") || strings.HasPrefix(c.DetailsURL, "http://")) {
		fmt.Fprintf(&head, "\n[Open in the console](%s)\n", strings.NewReplacer("(", "%28", ")", "%29", " ", "%20").Replace(c.DetailsURL))
	}
	if c.Plan == "" {
		return TruncateComment(head.String(), limit)
	}
	plan := strings.TrimRight(strings.ToValidUTF8(c.Plan, "\uFFFD"), "\n")
	fence := fenceFor(plan)
	open := "\n<details><summary>Show plan</summary>\n\n" + fence + "text\n"
	end := "\n" + fence + "\n\n</details>\n"
	pointer := fmt.Sprintf("\n_The plan is truncated: see `terrace plan %s` or the console._\n", ref)
	whole := head.String() + open + plan + end
	if textLen(whole) <= limit {
		return whole
	}
	room := limit - textLen(head.String()+open+end+pointer)
	if room <= 0 {
		return TruncateComment(head.String()+pointer, limit)
	}
	cut := cutText(plan, room)
	if i := strings.LastIndexByte(cut, '\n'); i > 0 {
		cut = cut[:i]
	}
	return head.String() + open + cut + end + pointer
}

// longestBacktickRun in s.
func longestBacktickRun(s string) int {
	longest, run := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return longest
}

func fenceFor(s string) string {
	return strings.Repeat("`", max(3, longestBacktickRun(s)+1))
}

func codeBlock(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	f := fenceFor(s)
	return f + "\n" + strings.TrimRight(s, "\n") + "\n" + f + "\n"
}

// codeSpan puts s, on one line, in an inline code span.
func codeSpan(s string) string {
	s = strings.Join(strings.Fields(clip(s, 512)), " ")
	if s == "" || !utf8.ValidString(s) {
		return "`?`"
	}
	f := strings.Repeat("`", longestBacktickRun(s)+1)
	return f + " " + s + " " + f
}

// PlanCommand is the comment that asks for plans of a pull request under
// trigger comment.
const PlanCommand = "/terrace plan"

// IsPlanCommand reports whether a comment body is PlanCommand: the command
// alone on its first line (leading spaces allowed).
func IsPlanCommand(body string) bool {
	first, _, _ := strings.Cut(strings.TrimLeft(body, " \t\r\n"), "\n")
	return strings.TrimSpace(first) == PlanCommand
}
