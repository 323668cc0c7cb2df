// Command gitserver is the git server of the end-to-end test that runs
// Flux's source-controller on the dev cluster's node: one repository, kept
// in memory, served over git's smart HTTP protocol, seeded from the files
// of a directory (a ConfigMap's volume). `gitserver push` commits the files
// of a directory onto a branch of such a server and pushes it over HTTP, as
// a developer's git push would.
//
// The server is go-git v6's backend: go-git v5's server refuses shallow
// fetches, and source-controller always clones with depth 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	git "github.com/go-git/go-git/v6"
	"github.com/go-git/go-git/v6/backend"
	"github.com/go-git/go-git/v6/config"
	"github.com/go-git/go-git/v6/plumbing"
	"github.com/go-git/go-git/v6/plumbing/client"
	"github.com/go-git/go-git/v6/plumbing/filemode"
	"github.com/go-git/go-git/v6/plumbing/object"
	"github.com/go-git/go-git/v6/plumbing/storer"
	"github.com/go-git/go-git/v6/plumbing/transport"
	githttp "github.com/go-git/go-git/v6/plumbing/transport/http"
	"github.com/go-git/go-git/v6/storage"
	"github.com/go-git/go-git/v6/storage/memory"
)

const usage = `usage:
  gitserver serve --listen :8080 --repo terrace.git --branch main --seed DIR
  gitserver push --url http://HOST/terrace.git --branch main --from DIR --message MSG`

func main() {
	log.SetFlags(log.LstdFlags | log.LUTC)
	if len(os.Args) < 2 {
		log.Fatal(usage)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	default:
		err = errors.New(usage)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", ":8080", "address to serve git's smart HTTP protocol on")
	repo := fs.String("repo", "terrace.git", "the repository's path in URLs")
	branch := fs.String("branch", "main", "the branch the seed is committed to, and HEAD")
	seed := fs.String("seed", "", "directory whose files are the first commit")
	_ = fs.Parse(args)

	st := memory.NewStorage()
	ref := plumbing.NewBranchReferenceName(*branch)
	if *seed != "" {
		hash, err := commitDir(st, ref, *seed, "seed from "+*seed)
		if err != nil {
			return err
		}
		log.Printf("seeded %s with %s at %s", *repo, ref, hash)
	}
	if err := st.SetReference(plumbing.NewSymbolicReference(plumbing.HEAD, ref)); err != nil {
		return err
	}
	server := backend.New(oneRepo{path: strings.Trim(*repo, "/"), storer: st})
	server.ErrorLog = log.Default()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("/", &serialized{next: server})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("serving /%s on %s", strings.Trim(*repo, "/"), *listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// oneRepo loads the one repository this server holds.
type oneRepo struct {
	path   string
	storer storage.Storer
}

func (l oneRepo) Load(u *url.URL) (storage.Storer, error) {
	if strings.Trim(u.Path, "/") != l.path {
		return nil, transport.ErrRepositoryNotFound
	}
	return l.storer, nil
}

// serialized lets fetches run together and a push alone: the in-memory
// storage's maps are not safe for a write beside reads.
type serialized struct {
	mu   sync.RWMutex
	next http.Handler
}

func (s *serialized) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pushing := strings.HasSuffix(r.URL.Path, "/git-receive-pack")
	if pushing {
		s.mu.Lock()
		defer s.mu.Unlock()
	} else {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	log.Printf("%s %s", r.Method, r.URL.RequestURI())
	s.next.ServeHTTP(w, r)
}

func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	remote := fs.String("url", "", "the repository's URL")
	branch := fs.String("branch", "main", "the branch to commit to and push")
	from := fs.String("from", "", "directory whose files replace the branch's")
	message := fs.String("message", "update", "the commit message")
	_ = fs.Parse(args)
	if *remote == "" || *from == "" {
		return errors.New(usage)
	}
	ref := plumbing.NewBranchReferenceName(*branch)
	// The server asks a push for credentials, any will do.
	auth := client.WithHTTPAuth(&githttp.BasicAuth{Username: "terrace", Password: "e2e"})
	repo, err := git.Clone(memory.NewStorage(), nil, &git.CloneOptions{URL: *remote, ReferenceName: ref, SingleBranch: true, ClientOptions: []client.Option{auth}})
	if err != nil {
		return fmt.Errorf("failed to clone %s: %w", *remote, err)
	}
	hash, err := commitDir(repo.Storer, ref, *from, *message)
	if err != nil {
		return err
	}
	spec := config.RefSpec(ref.String() + ":" + ref.String())
	if err := repo.Push(&git.PushOptions{RefSpecs: []config.RefSpec{spec}, ClientOptions: []client.Option{auth}}); err != nil {
		return fmt.Errorf("failed to push %s to %s: %w", hash, *remote, err)
	}
	fmt.Printf("pushed %s@sha1:%s\n", *branch, hash)
	return nil
}

// commitDir commits the regular files at the top of dir (names starting
// with a dot left out, as a ConfigMap volume's own entries are) as the
// whole tree of a new commit on ref, after the commit ref points at, if
// any, and moves ref to it.
func commitDir(st storer.Storer, ref plumbing.ReferenceName, dir, message string) (plumbing.Hash, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	var tree object.Tree
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return plumbing.ZeroHash, err
		}
		blob := st.NewEncodedObject()
		blob.SetType(plumbing.BlobObject)
		w, err := blob.Writer()
		if err != nil {
			return plumbing.ZeroHash, err
		}
		if _, err := w.Write(data); err != nil {
			return plumbing.ZeroHash, err
		}
		if err := w.Close(); err != nil {
			return plumbing.ZeroHash, err
		}
		hash, err := st.SetEncodedObject(blob)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		tree.Entries = append(tree.Entries, object.TreeEntry{Name: e.Name(), Mode: filemode.Regular, Hash: hash})
	}
	if len(tree.Entries) == 0 {
		return plumbing.ZeroHash, fmt.Errorf("no files in %s", dir)
	}
	sort.Slice(tree.Entries, func(i, j int) bool { return tree.Entries[i].Name < tree.Entries[j].Name })
	treeHash, err := store(st, &tree)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	sig := object.Signature{Name: "Terrace e2e", Email: "e2e@terrace.dev", When: time.Now()}
	commit := &object.Commit{Author: sig, Committer: sig, Message: message + "\n", TreeHash: treeHash}
	if current, err := st.Reference(ref); err == nil {
		commit.ParentHashes = []plumbing.Hash{current.Hash()}
	} else if !errors.Is(err, plumbing.ErrReferenceNotFound) {
		return plumbing.ZeroHash, err
	}
	hash, err := store(st, commit)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	return hash, st.SetReference(plumbing.NewHashReference(ref, hash))
}

func store(st storer.EncodedObjectStorer, obj interface {
	Encode(plumbing.EncodedObject) error
}) (plumbing.Hash, error) {
	enc := st.NewEncodedObject()
	if err := obj.Encode(enc); err != nil {
		return plumbing.ZeroHash, err
	}
	return st.SetEncodedObject(enc)
}
