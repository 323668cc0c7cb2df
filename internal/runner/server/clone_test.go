package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

func cloneCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantCloneError checks a refused clone's code, reason and words, and that
// its message holds none of the secrets.
func wantCloneError(t *testing.T, err error, code codes.Code, reason string, words []string, secrets ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("clone succeeded, want %s (%s)", reason, code)
	}
	if status.Code(err) != code || runner.Reason(err) != reason {
		t.Fatalf("clone failed with %v (reason %q), want %s (%s)", err, runner.Reason(err), reason, code)
	}
	msg := status.Convert(err).Message()
	for _, w := range words {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q does not say %q", msg, w)
		}
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(msg, s) {
			t.Errorf("message %q quotes a credential", msg)
		}
	}
}

func readSource(t *testing.T, tr *testRunner) map[string]string {
	t.Helper()
	got := map[string]string{}
	src := filepath.Join(tr.workDir, "source")
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			got[rel] = "->" + target
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			got[rel] = string(data)
			if info.Mode()&0o100 != 0 {
				got[rel] += " (executable)"
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCloneFollowsABranch: a branch is cloned shallow, its tree becomes
// the source without .git, the revision is Flux's, and the source digest
// depends on the commit only: it is the digest of the very tarball Build
// makes of the same files (what a Program of them uploads).
func TestCloneFollowsABranch(t *testing.T) {
	repo := newTestRepo(t)
	files := map[string]string{"main.tf": "output \"a\" { value = 1 }\n", "modules/net/main.tf": "locals {}\n"}
	first := repo.commit("main", "first module\n\nwith a body", files)
	url := repo.serveHTTP()
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)

	resp, err := tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "main"}, "")
	if err != nil {
		t.Fatalf("clone failed: %v", err)
	}
	c := resp.GetCommit()
	if c.GetRevision() != "main@sha1:"+first || c.GetMessage() != "first module" || c.GetAuthor() != "Ada Lovelace <ada@example.com>" || c.GetCommittedAtUnix() != repo.when.Unix() {
		t.Fatalf("clone resolved %+v, want main@sha1:%s, its first message line, author and time", c, first)
	}
	if got := readSource(t, tr); len(got) != 2 || got["main.tf"] != files["main.tf"] || got["modules/net/main.tf"] != files["modules/net/main.tf"] {
		t.Fatalf("source holds %v, want exactly the commit's files (no .git)", got)
	}
	_, want := buildArchive(t, files)
	if resp.GetSource().GetDigest() != want {
		t.Fatalf("source digest %s, want %s: Build's digest of the same files", resp.GetSource().GetDigest(), want)
	}

	// An empty ref is the branch main; the same commit gives the same digest.
	again, err := tr.client.Clone(ctx, url, nil, "")
	if err != nil || again.GetSource().GetDigest() != want || again.GetCommit().GetRevision() != c.GetRevision() {
		t.Fatalf("second clone: %v, %v; want the same revision and digest", again, err)
	}

	// A new commit is a new revision; the old source is replaced.
	second := repo.commit("main", "second", map[string]string{"main.tf": "output \"b\" { value = 2 }\n"})
	resp, err = tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "main"}, "")
	if err != nil || resp.GetCommit().GetRevision() != "main@sha1:"+second {
		t.Fatalf("clone after a push: %v, %v; want main@sha1:%s", resp, err, second)
	}
	if got := readSource(t, tr); len(got) != 1 {
		t.Fatalf("source after the second clone holds %v, want only the new commit's main.tf", got)
	}

	// init works on the cloned module unchanged.
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init of the cloned module failed: %v", err)
	}
}

// TestCloneTagsSemverAndCommits resolves each kind of ref to the commit
// and revision Flux would.
func TestCloneTagsSemverAndCommits(t *testing.T) {
	repo := newTestRepo(t)
	v1 := repo.commit("main", "v1", map[string]string{"main.tf": "# v1\n", "run.sh": "#!/bin/sh\necho hi\n", "link.tf": "->main.tf"})
	repo.tag("v1.0.0", "")
	v12 := repo.commit("main", "v1.2", map[string]string{"main.tf": "# v1.2\n"})
	repo.tag("v1.2.0", "annotated release")
	repo.tag("not-a-version", "")
	v2 := repo.commit("main", "v2", map[string]string{"main.tf": "# v2\n"})
	repo.tag("v2.0.0", "")
	url := repo.serveHTTP()
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)

	for _, tc := range []struct {
		name     string
		ref      *runnerv1.GitRef
		revision string
		mainTF   string
	}{
		{"tag", &runnerv1.GitRef{Tag: "v1.0.0"}, "v1.0.0@sha1:" + v1, "# v1\n"},
		{"annotated tag", &runnerv1.GitRef{Tag: "v1.2.0"}, "v1.2.0@sha1:" + v12, "# v1.2\n"},
		{"semver range", &runnerv1.GitRef{Semver: ">=1.0.0 <2.0.0"}, "v1.2.0@sha1:" + v12, "# v1.2\n"},
		{"semver highest", &runnerv1.GitRef{Semver: "*"}, "v2.0.0@sha1:" + v2, "# v2\n"},
		{"bare commit", &runnerv1.GitRef{Commit: v1}, "sha1:" + v1, "# v1\n"},
		{"commit on a branch", &runnerv1.GitRef{Branch: "main", Commit: v12}, "main@sha1:" + v12, "# v1.2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := tr.client.Clone(ctx, url, tc.ref, "")
			if err != nil {
				t.Fatalf("clone failed: %v", err)
			}
			if resp.GetCommit().GetRevision() != tc.revision {
				t.Fatalf("revision %s, want %s", resp.GetCommit().GetRevision(), tc.revision)
			}
			if got := readSource(t, tr)["main.tf"]; got != tc.mainTF {
				t.Fatalf("main.tf is %q, want %q", got, tc.mainTF)
			}
		})
	}
	// Modes and links inside the tree survive, as a tarball's would.
	if _, err := tr.client.Clone(ctx, url, &runnerv1.GitRef{Tag: "v1.0.0"}, ""); err != nil {
		t.Fatal(err)
	}
	got := readSource(t, tr)
	if got["run.sh"] != "#!/bin/sh\necho hi\n (executable)" || got["link.tf"] != "->main.tf" {
		t.Fatalf("source of v1.0.0 is %v, want run.sh executable and link.tf a link to main.tf", got)
	}
}

// TestCloneRefusesWhatIsNotThere: each missing ref is named in a NotFound
// error; a bad request is refused before any connection.
func TestCloneRefusesWhatIsNotThere(t *testing.T) {
	repo := newTestRepo(t)
	repo.commit("main", "one", map[string]string{"main.tf": "# one\n"})
	repo.tag("v1.0.0", "")
	url := repo.serveHTTP()
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)
	missing := strings.Repeat("ab", 20)
	for _, tc := range []struct {
		name  string
		url   string
		ref   *runnerv1.GitRef
		code  codes.Code
		why   string
		words []string
	}{
		{"tag", url, &runnerv1.GitRef{Tag: "v9.9.9"}, codes.NotFound, runner.ReasonGitRefNotFound, []string{`tag "v9.9.9" not found`, "/repo.git"}},
		{"branch", url, &runnerv1.GitRef{Branch: "nope"}, codes.NotFound, runner.ReasonGitRefNotFound, []string{`branch "nope" not found`}},
		{"commit", url, &runnerv1.GitRef{Commit: missing}, codes.NotFound, runner.ReasonGitRefNotFound, []string{"commit " + missing + " not found"}},
		{"semver", url, &runnerv1.GitRef{Semver: ">=2.0.0"}, codes.NotFound, runner.ReasonGitRefNotFound, []string{`a tag in the semver range ">=2.0.0" not found`}},
		{"repository", strings.TrimSuffix(url, "repo.git") + "other.git", nil, codes.NotFound, runner.ReasonGitRefNotFound, []string{"other.git", "not found"}},
		{"bad semver", url, &runnerv1.GitRef{Semver: "not a range"}, codes.InvalidArgument, runner.ReasonInvalidArgument, []string{"semver range"}},
		{"short commit", url, &runnerv1.GitRef{Commit: "abc"}, codes.InvalidArgument, runner.ReasonInvalidArgument, []string{"40 lowercase hex"}},
		{"file url", "file:///etc", nil, codes.InvalidArgument, runner.ReasonInvalidArgument, []string{`scheme "file"`}},
		{"unreachable", "https://127.0.0.1:1/repo.git", nil, codes.Unavailable, runner.ReasonFetchFailed, []string{"127.0.0.1:1"}},
		{"ssh without known_hosts", "ssh://git@127.0.0.1:1/repo.git", nil, codes.InvalidArgument, runner.ReasonInvalidArgument, []string{"identity and known_hosts"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tr.client.Clone(ctx, tc.url, tc.ref, "")
			wantCloneError(t, err, tc.code, tc.why, tc.words)
		})
	}
}

// TestCloneWithCredentialsOverHTTPS: username/password and bearerToken
// from the mounted Secret; a wrong one is GIT_AUTH_FAILED and its message
// quotes no credential; credentials never go over plain http.
func TestCloneWithCredentialsOverHTTPS(t *testing.T) {
	repo := newTestRepo(t)
	head := repo.commit("main", "one", map[string]string{"main.tf": "# one\n"})
	const user, password, token = "deploy", "s3cret-pa55", "t0ken-value"
	url, ca := repo.serveHTTPS(func(r *http.Request) bool {
		if u, p, ok := r.BasicAuth(); ok {
			return u == user && p == password
		}
		return r.Header.Get("Authorization") == "Bearer "+token
	})
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)

	basic := credentialsDir(t, map[string]string{"username": user, "password": password + "\n", "ca.crt": string(ca)})
	resp, err := tr.client.Clone(ctx, url, nil, basic)
	if err != nil || resp.GetCommit().GetRevision() != "main@sha1:"+head {
		t.Fatalf("clone with username/password: %v, %v", resp, err)
	}
	bearer := credentialsDir(t, map[string]string{"bearerToken": token, "ca.crt": string(ca)})
	if _, err := tr.client.Clone(ctx, url, nil, bearer); err != nil {
		t.Fatalf("clone with bearerToken: %v", err)
	}

	wrong := credentialsDir(t, map[string]string{"username": user, "password": "wrong-" + password, "ca.crt": string(ca)})
	_, err = tr.client.Clone(ctx, url, nil, wrong)
	wantCloneError(t, err, codes.PermissionDenied, runner.ReasonGitAuthFailed, []string{"refused the credentials", "127.0.0.1"}, password, "wrong-"+password)
	noCreds := credentialsDir(t, map[string]string{"ca.crt": string(ca)})
	_, err = tr.client.Clone(ctx, url, nil, noCreds)
	wantCloneError(t, err, codes.PermissionDenied, runner.ReasonGitAuthFailed, nil)

	// A password in the URL itself is never quoted either.
	inURL := strings.Replace(url, "https://", "https://"+user+":wrong-"+password+"@", 1)
	_, err = tr.client.Clone(ctx, inURL, nil, noCreds)
	wantCloneError(t, err, codes.PermissionDenied, runner.ReasonGitAuthFailed, nil, "wrong-"+password)

	// Without ca.crt the test server's certificate is not trusted.
	_, err = tr.client.Clone(ctx, url, nil, credentialsDir(t, map[string]string{"bearerToken": token}))
	wantCloneError(t, err, codes.Unavailable, runner.ReasonFetchFailed, []string{"certificate"}, token)

	_, err = tr.client.Clone(ctx, repo.serveHTTP(), nil, credentialsDir(t, map[string]string{"bearerToken": token}))
	wantCloneError(t, err, codes.InvalidArgument, runner.ReasonInvalidArgument, []string{"only over https"}, token)
}

// TestCloneOverSSHChecksTheHostKey: identity and known_hosts from the
// Secret; a host key not in known_hosts, or another one, is refused
// before anything is sent, naming the host.
func TestCloneOverSSHChecksTheHostKey(t *testing.T) {
	repo := newTestRepo(t)
	head := repo.commit("main", "one", map[string]string{"main.tf": "# one\n"})
	identity, pub := newClientKey(t)
	srv := serveSSH(t, repo.root, pub)
	other := serveSSH(t, repo.root, pub) // another host key
	url := "ssh://git@" + srv.addr + "/repo.git"
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)

	good := credentialsDir(t, map[string]string{"identity": string(identity), "known_hosts": srv.knownHostsLine() + "\n"})
	resp, err := tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "main"}, good)
	if err != nil || resp.GetCommit().GetRevision() != "main@sha1:"+head {
		t.Fatalf("clone over ssh: %v, %v", resp, err)
	}

	unknown := credentialsDir(t, map[string]string{"identity": string(identity), "known_hosts": other.knownHostsLine() + "\n"})
	_, err = tr.client.Clone(ctx, url, nil, unknown)
	wantCloneError(t, err, codes.FailedPrecondition, runner.ReasonGitHostKeyUnknown, []string{"is not in known_hosts", srv.addr})

	// The same host name with another key: a changed (or impostor) host.
	changed := strings.Replace(other.knownHostsLine(), other.addr[strings.LastIndex(other.addr, ":")+1:], srv.addr[strings.LastIndex(srv.addr, ":")+1:], 1)
	mismatch := credentialsDir(t, map[string]string{"identity": string(identity), "known_hosts": changed + "\n"})
	_, err = tr.client.Clone(ctx, url, nil, mismatch)
	wantCloneError(t, err, codes.FailedPrecondition, runner.ReasonGitHostKeyUnknown, []string{"does not match", srv.addr})

	stranger, _ := newClientKey(t)
	wrongKey := credentialsDir(t, map[string]string{"identity": string(stranger), "known_hosts": srv.knownHostsLine() + "\n"})
	_, err = tr.client.Clone(ctx, url, nil, wrongKey)
	wantCloneError(t, err, codes.PermissionDenied, runner.ReasonGitAuthFailed, []string{srv.addr})

	noKnownHosts := credentialsDir(t, map[string]string{"identity": string(identity)})
	_, err = tr.client.Clone(ctx, url, nil, noKnownHosts)
	wantCloneError(t, err, codes.InvalidArgument, runner.ReasonInvalidArgument, []string{"known_hosts"})
}

// TestCloneIsBoundedAndChecked: a repository over the clone limit is
// TOO_LARGE; a link leaving the tree is refused as an archive's would be,
// and nothing of it is left in the source.
func TestCloneIsBoundedAndChecked(t *testing.T) {
	repo := newTestRepo(t)
	random := make([]byte, 600<<10)
	for i := range random {
		random[i] = byte((i*7919 + i/13*104729) % 251)
	}
	repo.commit("big", "big", map[string]string{"main.tf": "# big\n", "blob.txt": base64.StdEncoding.EncodeToString(random)})
	repo.commit("escape", "escape", map[string]string{"main.tf": "# escape\n", "passwd.tf": "->../../../../etc/passwd"})
	url := repo.serveHTTP()
	tr := startRunner(t, nil, func(c *Config) { c.MaxCloneBytes = 256 << 10 })
	ctx := cloneCtx(t)

	_, err := tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "big"}, "")
	wantCloneError(t, err, codes.InvalidArgument, runner.ReasonTooLarge, []string{`branch "big"`, "clone limit"})

	_, err = tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "escape"}, "")
	wantCloneError(t, err, codes.InvalidArgument, runner.ReasonUnsafeArchive, []string{"passwd.tf"})
	if got := readSource(t, tr); len(got) != 0 {
		t.Fatalf("a refused checkout left %v in the source", got)
	}
	if out := tr.filesOutside(t); len(out) != 0 {
		t.Fatalf("files written outside the work dir: %v", out)
	}
}

// fluxLikeArchive packs files the way source-controller archives a
// checkout: its own order, the checkout's modes and times, no directory
// entries: other bytes, another digest, the same files.
func fluxLikeArchive(t *testing.T, files map[string]string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o664, Size: int64(len(files[n])), ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), artifact.Digest(buf.Bytes())
}

// TestACloneOfTheCommitAFluxArtifactHeldPlansNoChanges is the move from a
// Flux sourceRef to spec.source.git: the module applied from
// source-controller's tarball of a commit, then cloned at that commit,
// plans no changes, though the two archives' digests differ.
func TestACloneOfTheCommitAFluxArtifactHeldPlansNoChanges(t *testing.T) {
	stateFile := filepath.Join(t.TempDir(), "terraform.tfstate")
	files := map[string]string{
		"main.tf": `terraform {
  backend "local" { path = "` + stateFile + `" }
}
module "net" { source = "./modules/net" }
output "id" { value = module.net.id }
`,
		"modules/net/main.tf": `resource "terraform_data" "net" { input = "10.0.0.0/16" }
output "id" { value = terraform_data.net.output }
`,
	}
	repo := newTestRepo(t)
	head := repo.commit("main", "infra", files)
	url := repo.serveHTTP()
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)

	data, fluxDigest := fluxLikeArchive(t, files)
	if _, err := tr.client.Upload(ctx, fluxDigest, bytes.NewReader(data)); err != nil {
		t.Fatalf("upload of the Flux-like artifact: %v", err)
	}
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init: %v", err)
	}
	plan, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{PlanId: "first"}, nil)
	if err != nil || !plan.GetHasChanges() {
		t.Fatalf("first plan: %v, %v; want changes", plan, err)
	}
	if err := tr.client.Apply(ctx, "first", nil); err != nil {
		t.Fatalf("apply: %v", err)
	}

	resp, err := tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "main", Commit: head}, "")
	if err != nil {
		t.Fatalf("clone: %v", err)
	}
	if resp.GetSource().GetDigest() == fluxDigest {
		t.Fatal("the clone's archive has the Flux artifact's digest; the test means archives that differ")
	}
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init of the clone: %v", err)
	}
	plan, err = tr.client.Plan(ctx, &runnerv1.PlanRequest{PlanId: "second"}, nil)
	if err != nil {
		t.Fatalf("plan of the clone: %v", err)
	}
	if plan.GetHasChanges() {
		t.Fatalf("the clone of the same commit plans changes: %+v", plan.GetSummary())
	}
}
