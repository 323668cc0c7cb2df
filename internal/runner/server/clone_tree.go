package server

// What a clone becomes: its objects held within the clone's bounds, and the
// commit's tree turned into the entries of a module archive.

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/terrace-dev/terrace/internal/artifact"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// boundedStorage counts the objects a fetch stores, uncompressed, and
// stops the fetch past its limit.
type boundedStorage struct {
	*memory.Storage
	limit, used int64
}

func (b *boundedStorage) SetEncodedObject(o plumbing.EncodedObject) (plumbing.Hash, error) {
	b.used += o.Size()
	if b.used > b.limit {
		return plumbing.ZeroHash, errCloneTooLarge
	}
	return b.Storage.SetEncodedObject(o)
}

// treeEntries lists the commit's tree as archive entries: files with
// their executable bit, symbolic links with their target. Submodules are
// not followed (their commits are in other repositories) and nothing
// named .git is kept.
func treeEntries(commit *object.Commit) ([]artifact.Entry, error) {
	tree, err := commit.Tree()
	if err != nil {
		return nil, err
	}
	w := object.NewTreeWalker(tree, true, nil)
	defer w.Close()
	var entries []artifact.Entry
	for {
		name, e, err := w.Next()
		if err == io.EOF {
			return entries, nil
		}
		if err != nil {
			return nil, err
		}
		if hasGitSegment(name) {
			continue
		}
		switch e.Mode {
		case filemode.Dir, filemode.Submodule:
			continue
		}
		if len(entries) >= artifact.DefaultMaxEntries {
			return nil, fmt.Errorf("%w: more than %d files", artifact.ErrLimitExceeded, artifact.DefaultMaxEntries)
		}
		f, err := tree.TreeEntryFile(&e)
		if err != nil {
			return nil, err
		}
		content, err := f.Contents()
		if err != nil {
			return nil, err
		}
		entry := artifact.Entry{Name: name}
		switch e.Mode {
		case filemode.Symlink:
			entry.Link = content
		case filemode.Executable:
			entry.Executable, entry.Data = true, []byte(content)
		default:
			entry.Data = []byte(content)
		}
		entries = append(entries, entry)
	}
}

func hasGitSegment(name string) bool {
	for _, seg := range strings.Split(name, "/") {
		if strings.EqualFold(seg, ".git") {
			return true
		}
	}
	return false
}

// commitInfo is the revision as Flux writes it, and the commit's
// first message line, author and time.
func commitInfo(c *object.Commit, name string) *runnerv1.GitCommit {
	rev := "sha1:" + c.Hash.String()
	if name != "" {
		rev = name + "@" + rev
	}
	msg, _, _ := strings.Cut(strings.TrimSpace(c.Message), "\n")
	return &runnerv1.GitCommit{
		Revision:        rev,
		Message:         truncateUTF8(strings.TrimSpace(msg), 256),
		Author:          truncateUTF8(fmt.Sprintf("%s <%s>", c.Author.Name, c.Author.Email), 256),
		CommittedAtUnix: c.Committer.When.Unix(),
	}
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
