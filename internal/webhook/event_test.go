package webhook

import (
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// GitHub documents this secret, payload and X-Hub-Signature-256.
const (
	docSecret    = "It's a Secret to Everybody"
	docPayload   = "Hello, World!"
	docSignature = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
)

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestSignaturesVerifyAsTheForgesDocument(t *testing.T) {
	for name, h := range map[string]http.Header{
		"github":  headers("X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256="+docSignature),
		"gitea":   headers("X-Gitea-Event", "push", "X-Gitea-Signature", docSignature, "X-GitHub-Event", "push", "X-Hub-Signature-256", "sha256=00"),
		"forgejo": headers("X-Forgejo-Event", "push", "X-Forgejo-Signature", docSignature),
		"gitlab":  headers("X-Gitlab-Event", "Push Hook", "X-Gitlab-Token", docSecret),
	} {
		d, err := readDelivery(h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !d.verify([]byte(docPayload), []byte(docSecret)) {
			t.Errorf("%s: the documented signature does not verify", name)
		}
		if d.verify([]byte(docPayload), []byte("It's a Secret to Everybody!")) {
			t.Errorf("%s: another secret verifies", name)
		}
		if d.forge != forgeGitLab && d.verify([]byte(docPayload+" "), []byte(docSecret)) {
			t.Errorf("%s: another payload verifies", name)
		}
		if d.verify([]byte(docPayload), nil) {
			t.Errorf("%s: an empty secret verifies", name)
		}
	}
}

func TestUnsignedDeliveriesAreRefused(t *testing.T) {
	for name, h := range map[string]http.Header{
		"github without signature":      headers("X-GitHub-Event", "push"),
		"github with the sha1 only":     headers("X-GitHub-Event", "push", "X-Hub-Signature", "sha1=abc"),
		"gitea with an empty signature": headers("X-Gitea-Event", "push", "X-Gitea-Signature", ""),
		"gitlab without token":          headers("X-Gitlab-Event", "Push Hook"),
	} {
		if _, err := readDelivery(h); err != errUnsigned {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := readDelivery(headers("X-Bitbucket-Event", "push")); err != errNoForge {
		t.Errorf("unknown forge: %v", err)
	}
}

func sample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseDocumentedPayloads(t *testing.T) {
	for _, tc := range []struct {
		file  string
		d     delivery
		want  event
		wantN int
	}{
		{"github-push.json", delivery{forge: forgeGitHub, event: "push"},
			event{kind: kindPush, ref: "refs/heads/main", headSHA: "a10867b14bb761a232cd80139fbd4c0d33264240"}, 3},
		{"github-pull-request.json", delivery{forge: forgeGitHub, event: "pull_request"},
			event{kind: kindPullRequest, base: "main", number: 2, action: "opened", headSHA: "ec26c3e57ca3a959ca5aad62de7213c562f8c821"}, 3},
		{"gitea-push.json", delivery{forge: forgeGitea, event: "push"},
			event{kind: kindPush, ref: "refs/heads/develop", headSHA: "bffeb74224043ba2feb48d137756c8a9331c449a"}, 3},
		{"gitlab-push.json", delivery{forge: forgeGitLab, event: "Push Hook"},
			event{kind: kindPush, ref: "refs/heads/master", headSHA: "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"}, 3},
		{"gitlab-merge-request.json", delivery{forge: forgeGitLab, event: "Merge Request Hook"},
			event{kind: kindPullRequest, base: "master", number: 1, action: "open", headSHA: "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"}, 3},
	} {
		got, err := parseEvent(tc.d, kindOf(tc.d), sample(t, tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if len(got.repoURLs) != tc.wantN {
			t.Errorf("%s: repository URLs %v", tc.file, got.repoURLs)
		}
		got.repoURLs = nil
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.file, got, tc.want)
		}
	}
}

func TestParseRefusesWhatIsNoEvent(t *testing.T) {
	d := delivery{forge: forgeGitHub, event: "push"}
	for _, body := range []string{"", "[]", `{"ref":"refs/heads/main"}`, "payload=%7B"} {
		if _, err := parseEvent(d, kindPush, []byte(body)); err == nil {
			t.Errorf("%q parsed", body)
		}
	}
	if kindOf(delivery{forge: forgeGitHub, event: "star"}) != "" || kindOf(delivery{forge: forgeGitLab, event: "Pipeline Hook"}) != "" {
		t.Error("an event Terrace does not act on has a kind")
	}
}
