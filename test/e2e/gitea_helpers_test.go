package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"code.gitea.io/sdk/gitea"
	"github.com/go-git/go-billy/v5/memfs"
	git "github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// The shared Gitea (startGitea): a Deployment and its Service in the
// namespace gitea of the shared dev cluster.
const (
	giteaNamespace = "gitea"
	giteaName      = "gitea"
	giteaPort      = 3000
	// giteaImage is the image pushGiteaImage builds (the dev registry
	// answers for every registry name).
	giteaImage = "ghcr.io/terrace-dev/e2e-gitea:v1.26.0"
	// giteaInClusterURL is Gitea's ROOT_URL: its Service through the
	// cluster's DNS, as pods (runners, a Stack's spec.source.git.url) and
	// Gitea's own clone URLs and webhook payloads name it.
	giteaInClusterURL = "http://gitea.gitea.svc.cluster.local:3000"
	// giteaAdmin is the site administrator the init step creates ("admin"
	// is a name Gitea reserves).
	giteaAdmin = "terrace"
)

// giteaServer is a real Gitea (code.gitea.io/gitea, built by
// hack/tools/build.sh) running in the dev cluster, with PostgreSQL for its
// database, for the tests of Terrace's Git source, pull-request plans and
// webhooks.
type giteaServer struct {
	// InClusterURL is where pods reach Gitea: its Service's DNS name
	// (giteaInClusterURL), also its ROOT_URL.
	InClusterURL string
	// URL is where the test process reaches Gitea: the Service's cluster
	// IP, which this host routes to the node.
	URL string
	// AdminUser and AdminPassword sign in as the site administrator;
	// AdminToken is an access token of theirs with every scope.
	AdminUser, AdminPassword, AdminToken string
	// API is the go-gitea SDK's client as the administrator.
	API *gitea.Client
}

// giteaRepo is a repository of the shared Gitea, owned by its
// administrator.
type giteaRepo struct {
	g           *giteaServer
	Owner, Name string
	// CloneURL is the repository's git URL from the test process;
	// InClusterCloneURL from pods (a Stack's spec.source.git.url).
	CloneURL, InClusterCloneURL string
}

var sharedGitea struct {
	once sync.Once
	g    *giteaServer
	err  error
}

// startGitea returns the test run's Gitea, starting it in the shared dev
// cluster on first use (~20 s once the image is pushed) with a database of
// its own in the shared PostgreSQL. Every test shares it: create
// repositories (and users) with names of your test's own.
func startGitea(ctx context.Context, t testing.TB) *giteaServer {
	t.Helper()
	giteaBin := requireGiteaBin(t)
	dev := sharedDev(t)
	startSharedPostgres(t)
	sharedGitea.once.Do(func() {
		begin := time.Now()
		sharedGitea.g, sharedGitea.err = deployGitea(ctx, dev, giteaBin, sharedPostgres.url, sharedPostgres.tcpURL)
		if sharedGitea.err == nil {
			t.Logf("gitea ready at %s (%s in the cluster) after %s", sharedGitea.g.URL, sharedGitea.g.InClusterURL, time.Since(begin).Round(100*time.Millisecond))
		}
	})
	if sharedGitea.err != nil {
		t.Fatalf("failed to start gitea: %v", sharedGitea.err)
	}
	return sharedGitea.g
}

// requireGiteaBin returns the directory `make tools` fills with gitea and
// its static files, or fails the test with what to do.
func requireGiteaBin(t testing.TB) string {
	t.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	if tools.GiteaBin == "" {
		t.Fatal("hack/tools/build.sh --env names no TERRACE_GITEA_BIN")
	}
	for _, f := range []string{"gitea", "static/templates", "static/options", "static/public"} {
		if _, err := os.Stat(filepath.Join(tools.GiteaBin, f)); err != nil {
			t.Fatalf("%s is missing from %q: run `make tools` (it builds Gitea from its Go module)", f, tools.GiteaBin)
		}
	}
	return tools.GiteaBin
}

// deployGitea pushes the Gitea image, creates its database in the
// PostgreSQL at pgURL (reached by pods at pgPodURL), runs it as a
// Deployment behind a Service in the namespace gitea, and signs in as its
// administrator.
func deployGitea(ctx context.Context, dev *devcluster.Dev, giteaBin, pgURL, pgPodURL string) (*giteaServer, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := pushGiteaImage(ctx, dev.Registry.Host, giteaImage, giteaBin); err != nil {
		return nil, err
	}
	database := "gitea_" + randomHex(6)
	if err := createDatabase(ctx, pgURL, database); err != nil {
		return nil, err
	}
	pg, err := pgconn.ParseConfig(pgPodURL)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the pods' PostgreSQL URL: %w", err)
	}
	if strings.HasPrefix(pg.Host, "/") {
		return nil, fmt.Errorf("PostgreSQL listens on a unix socket only (%s): pods cannot reach it", pg.Host)
	}
	g := &giteaServer{InClusterURL: giteaInClusterURL, AdminUser: giteaAdmin, AdminPassword: randomHex(16)}
	ini := giteaConfig(giteaSettings{
		database:     database,
		dbHost:       net.JoinHostPort(pg.Host, fmt.Sprint(pg.Port)),
		dbUser:       pg.User,
		dbPassword:   pg.Password,
		webhookHosts: slotCIDR(dev.Node.HostIP()) + ",*.cluster.local",
	})

	cs, err := kubernetes.NewForConfig(dev.Cluster.Config)
	if err != nil {
		return nil, err
	}
	if err := applyGitea(ctx, cs, ini, g.AdminPassword); err != nil {
		return nil, err
	}
	if err := waitGiteaAvailable(ctx, cs); err != nil {
		return nil, err
	}
	svc, err := cs.CoreV1().Services(giteaNamespace).Get(ctx, giteaName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	g.URL = fmt.Sprintf("http://%s", net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(giteaPort)))
	// The pod is Ready when /api/healthz answers; the Service may take a
	// moment longer (kube-proxy's rules).
	if err := poll(ctx, func() error { _, err := httpGet(strings.TrimPrefix(g.URL, "http://"), "/api/healthz"); return err }); err != nil {
		return nil, fmt.Errorf("gitea's Service %s does not answer: %w", g.URL, err)
	}
	basic, err := gitea.NewClient(g.URL, gitea.SetBasicAuth(g.AdminUser, g.AdminPassword), gitea.SetContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("failed to reach gitea's API at %s: %w", g.URL, err)
	}
	token, _, err := basic.CreateAccessToken(gitea.CreateAccessTokenOption{Name: "e2e", Scopes: []gitea.AccessTokenScope{gitea.AccessTokenScopeAll}})
	if err != nil {
		return nil, fmt.Errorf("failed to create the administrator's access token: %w", err)
	}
	g.AdminToken = token.Token
	if g.API, err = gitea.NewClient(g.URL, gitea.SetToken(g.AdminToken)); err != nil {
		return nil, err
	}
	return g, nil
}

// createDatabase creates an empty database in the PostgreSQL at url.
func createDatabase(ctx context.Context, url, name string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("failed to connect to PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" ENCODING 'UTF8'"); err != nil {
		return fmt.Errorf("failed to create gitea's database: %w", err)
	}
	return nil
}

// slotCIDR is the dev cluster's /16 (its pods, Services and the link, on
// which the tests' servers listen) from the host's end of the link.
func slotCIDR(hostIP string) string {
	ip := net.ParseIP(hostIP).To4()
	return fmt.Sprintf("%d.%d.0.0/16", ip[0], ip[1])
}

type giteaSettings struct {
	database, dbHost, dbUser, dbPassword string
	// webhookHosts is [webhook] ALLOWED_HOST_LIST.
	webhookHosts string
}

// giteaConfig is Gitea's app.ini: installed (INSTALL_LOCK) with secrets of
// this run, PostgreSQL, HTTP only on giteaPort, every URL it writes (clone
// URLs, links, webhook payloads) under ROOT_URL whoever asks (not under
// the request's Host: the test process calls it by IP), its data in the
// pod's emptyDir, and nothing that reaches past the dev cluster (offline
// mode, no update checker, mailer, OpenID, Actions or packages; Gravatar
// and federated avatars are off by default, settings of the admin panel
// now). Webhooks may call the dev cluster's addresses, which Gitea refuses
// by default as private ones.
func giteaConfig(s giteaSettings) string {
	work := giteaDataDir + "/gitea"
	jwt := make([]byte, 32)
	_, _ = rand.Read(jwt)
	return fmt.Sprintf(`APP_NAME = Terrace e2e
RUN_MODE = prod
WORK_PATH = %[1]s

[server]
PROTOCOL = http
HTTP_ADDR = 0.0.0.0
HTTP_PORT = %[2]d
DOMAIN = gitea.gitea.svc.cluster.local
ROOT_URL = %[3]s/
LOCAL_ROOT_URL = http://127.0.0.1:%[2]d/
PUBLIC_URL_DETECTION = never
APP_DATA_PATH = %[1]s/data
STATIC_ROOT_PATH = %[4]s
DISABLE_SSH = true
START_SSH_SERVER = false
LFS_START_SERVER = false
OFFLINE_MODE = true

[database]
DB_TYPE = postgres
HOST = %[5]s
NAME = %[6]s
USER = %[7]s
PASSWD = %[8]s
SSL_MODE = disable

[repository]
ROOT = %[1]s/repositories
SCRIPT_TYPE = sh
DEFAULT_BRANCH = main

[security]
INSTALL_LOCK = true
SECRET_KEY = %[9]s
INTERNAL_TOKEN = %[10]s
PASSWORD_COMPLEXITY = off

[oauth2]
JWT_SECRET = %[11]s

[service]
DISABLE_REGISTRATION = true
DEFAULT_KEEP_EMAIL_PRIVATE = true
NO_REPLY_ADDRESS = noreply.gitea.invalid
ENABLE_NOTIFY_MAIL = false

[mailer]
ENABLED = false

[openid]
ENABLE_OPENID_SIGNIN = false
ENABLE_OPENID_SIGNUP = false

[cron.update_checker]
ENABLED = false

[actions]
ENABLED = false

[packages]
ENABLED = false

[api]
ENABLE_SWAGGER = false

[webhook]
ALLOWED_HOST_LIST = %[12]s
DELIVER_TIMEOUT = 10

[session]
PROVIDER = memory

[cache]
ADAPTER = memory

[log]
MODE = console
LEVEL = Info
`, work, giteaPort, giteaInClusterURL, giteaStaticDir,
		s.dbHost, s.database, s.dbUser, s.dbPassword,
		randomHex(32), randomHex(32), base64.RawURLEncoding.EncodeToString(jwt),
		s.webhookHosts)
}

// giteaInit copies app.ini where Gitea may write it, migrates the database
// and creates the administrator unless a first start of the pod did.
const giteaInit = `set -eu
mkdir -p /data/gitea/conf /data/tmp
cp /config/app.ini /data/gitea/conf/app.ini
gitea migrate --config /data/gitea/conf/app.ini
if ! gitea admin user list --admin --config /data/gitea/conf/app.ini | grep -qw "$GITEA_ADMIN"; then
  gitea admin user create --config /data/gitea/conf/app.ini --admin --username "$GITEA_ADMIN" \
    --password "$GITEA_ADMIN_PASSWORD" --email "$GITEA_ADMIN@example.com" --must-change-password=false
fi
`

// applyGitea creates the namespace, the Secret holding app.ini and the
// administrator's password, the Deployment and the Service.
func applyGitea(ctx context.Context, cs kubernetes.Interface, ini, adminPassword string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: giteaNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	labels := map[string]string{"app.kubernetes.io/name": giteaName}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: giteaName, Namespace: giteaNamespace},
		StringData: map[string]string{"app.ini": ini, "admin-password": adminPassword},
	}
	restricted := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: giteaDataDir}, {Name: "tmp", MountPath: "/tmp"}}
	env := []corev1.EnvVar{
		{Name: "GITEA_ADMIN", Value: giteaAdmin},
		{Name: "TMPDIR", Value: "/data/tmp"},
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: giteaName, Namespace: giteaNamespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](giteaUID), RunAsGroup: ptr.To[int64](giteaUID),
						FSGroup: ptr.To[int64](giteaUID), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					InitContainers: []corev1.Container{{
						Name: "setup", Image: giteaImage, Command: []string{"/bin/sh", "-c", giteaInit},
						Env: append(env, corev1.EnvVar{Name: "GITEA_ADMIN_PASSWORD", ValueFrom: &corev1.EnvVarSource{
							SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: giteaName}, Key: "admin-password"},
						}}),
						SecurityContext: restricted,
						VolumeMounts:    append(mounts, corev1.VolumeMount{Name: "config", MountPath: "/config", ReadOnly: true}),
					}},
					Containers: []corev1.Container{{
						Name: "gitea", Image: giteaImage, Args: []string{"web", "--config", giteaDataDir + "/gitea/conf/app.ini"},
						Env:             env,
						Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: giteaPort}},
						SecurityContext: restricted,
						VolumeMounts:    mounts,
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/api/healthz", Port: intstr.FromString("http")}},
							PeriodSeconds: 1, FailureThreshold: 3,
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "config", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: giteaName}}},
					},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: giteaName, Namespace: giteaNamespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: giteaPort, TargetPort: intstr.FromString("http")}},
		},
	}
	if _, err := cs.CoreV1().Secrets(giteaNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("failed to create gitea's Secret: %w", err)
	}
	if _, err := cs.AppsV1().Deployments(giteaNamespace).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("failed to create gitea's Deployment: %w", err)
	}
	if _, err := cs.CoreV1().Services(giteaNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("failed to create gitea's Service: %w", err)
	}
	return nil
}

// waitGiteaAvailable waits until Gitea's Deployment has its pod ready; on
// failure the error carries each container's phase and the end of its log.
func waitGiteaAvailable(ctx context.Context, cs kubernetes.Interface) error {
	err := poll(ctx, func() error {
		d, err := cs.AppsV1().Deployments(giteaNamespace).Get(ctx, giteaName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration != d.Generation || d.Status.ReadyReplicas < 1 {
			return errors.New("no pod ready yet")
		}
		return nil
	})
	if err == nil {
		return nil
	}
	var why strings.Builder
	pods, _ := cs.CoreV1().Pods(giteaNamespace).List(context.Background(), metav1.ListOptions{})
	for _, p := range pods.Items {
		fmt.Fprintf(&why, "\npod %s is %s", p.Name, p.Status.Phase)
		for _, c := range []string{"setup", "gitea"} {
			log, lerr := podLogs(context.Background(), cs, giteaNamespace, p.Name, &corev1.PodLogOptions{Container: c, TailLines: ptr.To[int64](40)})
			if lerr != nil {
				log = lerr.Error()
			}
			fmt.Fprintf(&why, "\ncontainer %s's log ends:\n%s", c, log)
		}
	}
	return fmt.Errorf("gitea did not become ready: %w%s", err, why.String())
}

// poll calls cond every 200 ms until it returns nil or ctx ends, and then
// returns cond's last error.
func poll(ctx context.Context, cond func() error) error {
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-ticker.C:
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createRepo creates an empty public repository of the administrator's,
// whose default branch becomes main with the first push. Name it after
// your test: every test shares the server.
func (g *giteaServer) createRepo(t testing.TB, name string) *giteaRepo {
	t.Helper()
	repo, _, err := g.API.CreateRepo(gitea.CreateRepoOption{Name: name, DefaultBranch: "main"})
	if err != nil {
		t.Fatalf("failed to create the gitea repository %s: %v", name, err)
	}
	return &giteaRepo{
		g: g, Owner: repo.Owner.UserName, Name: repo.Name,
		CloneURL:          fmt.Sprintf("%s/%s/%s.git", g.URL, repo.Owner.UserName, repo.Name),
		InClusterCloneURL: repo.CloneURL,
	}
}

// createUser creates a user who is no administrator and returns an access
// token of theirs with every scope (for a pull request from someone else,
// or a forge token with fewer rights).
func (g *giteaServer) createUser(t testing.TB, name string) (token string) {
	t.Helper()
	password := randomHex(16)
	if _, _, err := g.API.AdminCreateUser(gitea.CreateUserOption{
		Username: name, Email: name + "@example.com", Password: password, MustChangePassword: ptr.To(false),
	}); err != nil {
		t.Fatalf("failed to create the gitea user %s: %v", name, err)
	}
	c, err := gitea.NewClient(g.URL, gitea.SetBasicAuth(name, password))
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := c.CreateAccessToken(gitea.CreateAccessTokenOption{Name: "e2e", Scopes: []gitea.AccessTokenScope{gitea.AccessTokenScopeAll}})
	if err != nil {
		t.Fatalf("failed to create an access token for %s: %v", name, err)
	}
	return tok.Token
}

// push commits files onto branch and pushes the commit over HTTP, as a
// developer's git push would, returning its hash. The commit's tree is the
// branch's with files written over it (a file whose content is "" is
// removed); a branch that does not exist yet starts from the default
// branch's head, or as the first commit of an empty repository.
func (r *giteaRepo) push(t testing.TB, branch string, files map[string]string, message string) string {
	t.Helper()
	hash, err := r.pushAs(giteaAdmin, r.g.AdminToken, branch, files, message)
	if err != nil {
		t.Fatalf("failed to push to %s of %s: %v", branch, r.CloneURL, err)
	}
	if err := r.waitPushed(branch, hash); err != nil {
		t.Fatal(err)
	}
	return hash
}

// waitPushed waits until Gitea has taken in a push of hash to branch. Its
// post-receive hook records the branch before the push returns, but marks
// a repository no longer empty later, from a queue; until then its API
// answers 500 (a nil repository) for the branch.
func (r *giteaRepo) waitPushed(branch, hash string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := poll(ctx, func() error {
		repo, _, err := r.g.API.GetRepo(r.Owner, r.Name)
		if err != nil {
			return err
		}
		if repo.Empty {
			return errors.New("the repository is still marked empty")
		}
		b, _, err := r.g.API.GetRepoBranch(r.Owner, r.Name, branch)
		if err != nil {
			return err
		}
		if b.Commit == nil || b.Commit.ID != hash {
			return fmt.Errorf("%s is at %+v", branch, b.Commit)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gitea did not take in the push of %s to %s of %s/%s: %w", hash, branch, r.Owner, r.Name, err)
	}
	return nil
}

// pushAs is push with the credentials of another user (createUser's
// token), without waiting for Gitea to take the push in (waitPushed).
func (r *giteaRepo) pushAs(user, token, branch string, files map[string]string, message string) (string, error) {
	auth := &githttp.BasicAuth{Username: user, Password: token}
	fs := memfs.New()
	repo, err := git.Clone(memory.NewStorage(), fs, &git.CloneOptions{URL: r.CloneURL, Auth: auth})
	switch {
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		if repo, err = git.Init(memory.NewStorage(), fs); err != nil {
			return "", err
		}
		if _, err = repo.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{r.CloneURL}}); err != nil {
			return "", err
		}
		// The first commit: HEAD names the branch, which has no commit yet.
		if err := repo.Storer.SetReference(plumbing.NewSymbolicReference(plumbing.HEAD, plumbing.NewBranchReferenceName(branch))); err != nil {
			return "", err
		}
	case err != nil:
		return "", fmt.Errorf("failed to clone: %w", err)
	default:
		if err := checkoutForCommit(repo, branch); err != nil {
			return "", err
		}
	}
	wt, err := repo.Worktree()
	if err != nil {
		return "", err
	}
	for name, content := range files {
		if content == "" {
			if _, err := wt.Remove(name); err != nil {
				return "", fmt.Errorf("failed to remove %s: %w", name, err)
			}
			continue
		}
		if err := fs.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return "", err
		}
		f, err := fs.Create(name)
		if err != nil {
			return "", err
		}
		_, err = f.Write([]byte(content))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", err
		}
		if _, err := wt.Add(name); err != nil {
			return "", err
		}
	}
	hash, err := wt.Commit(message, &git.CommitOptions{
		Author:            &object.Signature{Name: user, Email: user + "@example.com", When: time.Now()},
		AllowEmptyCommits: true,
	})
	if err != nil {
		return "", fmt.Errorf("failed to commit: %w", err)
	}
	ref := plumbing.NewBranchReferenceName(branch)
	if err := repo.Push(&git.PushOptions{
		RemoteName: "origin", Auth: auth,
		RefSpecs: []gitconfig.RefSpec{gitconfig.RefSpec(ref + ":" + ref)},
	}); err != nil {
		return "", fmt.Errorf("failed to push: %w", err)
	}
	return hash.String(), nil
}

// checkoutForCommit checks out branch in a clone: the remote's branch, or
// a new one from the default branch's head.
func checkoutForCommit(repo *git.Repository, branch string) error {
	wt, err := repo.Worktree()
	if err != nil {
		return err
	}
	local := plumbing.NewBranchReferenceName(branch)
	if _, err := repo.Reference(local, false); err == nil { // the default branch, checked out by the clone
		return wt.Checkout(&git.CheckoutOptions{Branch: local, Force: true})
	}
	from, err := repo.Reference(plumbing.NewRemoteReferenceName("origin", branch), true)
	if err != nil {
		if from, err = repo.Head(); err != nil {
			return fmt.Errorf("the repository has neither %s nor a default branch: %w", branch, err)
		}
	}
	return wt.Checkout(&git.CheckoutOptions{Branch: local, Hash: from.Hash(), Create: true, Force: true})
}

// createBranch creates branch at the head of from, through the API.
func (r *giteaRepo) createBranch(t testing.TB, branch, from string) {
	t.Helper()
	if _, _, err := r.g.API.CreateBranch(r.Owner, r.Name, gitea.CreateBranchOption{BranchName: branch, OldBranchName: from}); err != nil {
		t.Fatalf("failed to create branch %s from %s in %s/%s: %v", branch, from, r.Owner, r.Name, err)
	}
}

// openPullRequest opens a pull request of head into base and returns it
// (its Index numbers it in the other calls).
func (r *giteaRepo) openPullRequest(t testing.TB, head, base, title string) *gitea.PullRequest {
	t.Helper()
	pr, _, err := r.g.API.CreatePullRequest(r.Owner, r.Name, gitea.CreatePullRequestOption{Head: head, Base: base, Title: title})
	if err != nil {
		t.Fatalf("failed to open a pull request of %s into %s in %s/%s: %v", head, base, r.Owner, r.Name, err)
	}
	return pr
}

// comment adds a comment to pull request (or issue) index, as the
// administrator.
func (r *giteaRepo) comment(t testing.TB, index int64, body string) *gitea.Comment {
	t.Helper()
	c, _, err := r.g.API.CreateIssueComment(r.Owner, r.Name, index, gitea.CreateIssueCommentOption{Body: body})
	if err != nil {
		t.Fatalf("failed to comment on #%d of %s/%s: %v", index, r.Owner, r.Name, err)
	}
	return c
}

// comments lists the comments of pull request (or issue) index, oldest
// first; an error is returned, not fatal, for polling with eventually.
func (r *giteaRepo) comments(index int64) ([]*gitea.Comment, error) {
	var all []*gitea.Comment
	for page := 1; ; page++ {
		cs, _, err := r.g.API.ListIssueComments(r.Owner, r.Name, index, gitea.ListIssueCommentOptions{ListOptions: gitea.ListOptions{Page: page, PageSize: 50}})
		if err != nil {
			return nil, fmt.Errorf("failed to list the comments of #%d of %s/%s: %w", index, r.Owner, r.Name, err)
		}
		all = append(all, cs...)
		if len(cs) < 50 {
			return all, nil
		}
	}
}

// statuses lists the commit statuses of ref (a commit hash, branch or
// tag), newest first; an error is returned, not fatal, for polling.
func (r *giteaRepo) statuses(ref string) ([]*gitea.Status, error) {
	ss, _, err := r.g.API.ListStatuses(r.Owner, r.Name, ref, gitea.ListStatusesOption{ListOptions: gitea.ListOptions{PageSize: 50}})
	if err != nil {
		return nil, fmt.Errorf("failed to list the statuses of %s in %s/%s: %w", ref, r.Owner, r.Name, err)
	}
	return ss, nil
}

// addWebhook makes Gitea call url (JSON, signed with secret in
// X-Gitea-Signature) on the events given ("push", "pull_request",
// "issue_comment", ...). Gitea calls addresses of the dev cluster only:
// pods, Services, and the host's end of the link (newLinkServer).
func (r *giteaRepo) addWebhook(t testing.TB, url, secret string, events ...string) *gitea.Hook {
	t.Helper()
	h, _, err := r.g.API.CreateRepoHook(r.Owner, r.Name, gitea.CreateHookOption{
		Type: gitea.HookTypeGitea, Active: true, Events: events,
		Config: map[string]string{"url": url, "content_type": "json", "secret": secret},
	})
	if err != nil {
		t.Fatalf("failed to add a webhook to %s/%s: %v", r.Owner, r.Name, err)
	}
	return h
}

// addCollaborator gives user access to the repository: "read", "write"
// or "admin".
func (r *giteaRepo) addCollaborator(t testing.TB, user, permission string) {
	t.Helper()
	mode := gitea.AccessMode(permission)
	if _, err := r.g.API.AddCollaborator(r.Owner, r.Name, user, gitea.AddCollaboratorOption{Permission: &mode}); err != nil {
		t.Fatalf("failed to make %s a collaborator of %s/%s: %v", user, r.Owner, r.Name, err)
	}
}
