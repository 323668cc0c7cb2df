package forge

import (
	"errors"
	"testing"
)

func TestParseRepository(t *testing.T) {
	for raw, want := range map[string]Repository{
		"https://github.com/octocat/Hello-World.git":          {"github.com", "octocat/Hello-World"},
		"https://GitHub.com/octocat/Hello-World/":             {"github.com", "octocat/Hello-World"},
		"ssh://git@github.com:22/octocat/Hello-World.git":     {"github.com", "octocat/Hello-World"},
		"git@github.com:octocat/Hello-World.git":              {"github.com", "octocat/Hello-World"},
		"git@gitlab.com:group/sub/project.git":                {"gitlab.com", "group/sub/project"},
		"https://user@gitea.example.com:3000/gitea/webhooks":  {"gitea.example.com", "gitea/webhooks"},
		"http://gitea.terrace-e2e.svc:3000/terrace/infra.git": {"gitea.terrace-e2e.svc", "terrace/infra"},
		"gitea.example.com:owner/repo":                        {"gitea.example.com", "owner/repo"},
	} {
		got, err := ParseRepository(raw)
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"", "file:///tmp/repo", "/tmp/repo", "https://github.com/", "https://github.com/a/../b", "git@host:", "ftp://h/o/r"} {
		if _, err := ParseRepository(raw); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: %v, want refused", raw, err)
		}
	}
}

func TestRepositoryKeyIsTheSameForEveryForm(t *testing.T) {
	var keys []string
	for _, raw := range []string{"https://github.com/Octocat/Hello-World.git", "git@GITHUB.com:octocat/hello-world", "ssh://git@github.com/octocat/Hello-World.git"} {
		r, err := ParseRepository(raw)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.Key())
	}
	if keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("keys %v", keys)
	}
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	gh := Config{Provider: GitHub}
	token := map[string][]byte{SecretToken: []byte("t")}
	for name, tc := range map[string]struct {
		pr     Config
		secret map[string][]byte
		url    string
	}{
		"no credentials":                {gh, map[string][]byte{}, octoRepo},
		"token and app":                 {gh, map[string][]byte{SecretToken: []byte("t"), SecretAppID: []byte("1")}, octoRepo},
		"app without installation":      {gh, map[string][]byte{SecretAppID: []byte("1"), SecretPrivateKey: []byte("x")}, octoRepo},
		"app key that is no PEM":        {gh, map[string][]byte{SecretAppID: []byte("1"), SecretInstallationID: []byte("2"), SecretPrivateKey: []byte("x")}, octoRepo},
		"app on gitlab":                 {Config{Provider: GitLab}, map[string][]byte{SecretAppID: []byte("1")}, "https://gitlab.com/a/b"},
		"gitea without apiURL":          {Config{Provider: Gitea}, token, "https://gitea.example.com/a/b"},
		"github enterprise, no apiURL":  {gh, token, "https://ghe.example.com/a/b"},
		"apiURL that is no http(s) URL": {Config{Provider: Gitea, APIURL: "file:///etc"}, token, "https://gitea.example.com/a/b"},
		"repository path without owner": {gh, token, "https://github.com/b"},
	} {
		if _, err := New(tc.pr, tc.secret, tc.url, Options{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, p := range []Provider{GitHub, GitLab} {
		host := map[Provider]string{GitHub: "github.com", GitLab: "gitlab.com"}[p]
		if _, err := New(Config{Provider: p}, token, "https://"+host+"/a/b", Options{}); err != nil {
			t.Errorf("%s without apiURL: %v", p, err)
		}
	}
}
