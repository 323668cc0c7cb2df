package launcher

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func testLauncher(t *testing.T) *Launcher {
	t.Helper()
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Options{Client: fake.NewClientset(), Authority: authority, DefaultImage: "ghcr.io/terrace-dev/terrace:v1"})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testStack() *terracev1.Stack {
	return &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a", UID: "stack-uid"}}
}

func container(pod *corev1.Pod) *corev1.Container { return &pod.Spec.Containers[0] }

func envValue(c *corev1.Container, name string) (corev1.EnvVar, int) {
	for i, e := range c.Env {
		if e.Name == name {
			return e, i
		}
	}
	return corev1.EnvVar{}, -1
}

func hasArg(c *corev1.Container, arg string) bool {
	for _, a := range c.Args {
		if a == arg {
			return true
		}
	}
	return false
}

func TestPodSpec(t *testing.T) {
	tests := []struct {
		name  string
		spec  func(*RunSpec)
		check func(t *testing.T, pod *corev1.Pod)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, pod *corev1.Pod) {
				c := container(pod)
				if c.Image != "ghcr.io/terrace-dev/terrace:v1" {
					t.Errorf("image = %q, want the launcher default", c.Image)
				}
				if pod.Spec.ServiceAccountName != "default" {
					t.Errorf("serviceAccountName = %q", pod.Spec.ServiceAccountName)
				}
				for _, arg := range []string{"--listen=[$(POD_IP)]:9090", "--health-listen=[$(POD_IP)]:9091", "--tls-dir=/etc/terrace/tls", "--work-dir=/var/lib/terrace/work", "--binary=tofu", "--interrupt-grace=2m0s"} {
					if !hasArg(c, arg) {
						t.Errorf("args %q lack %q", c.Args, arg)
					}
				}
				if !slices.Equal(c.Command, []string{"/usr/local/bin/terrace-runner"}) || hasArg(c, "runner") {
					t.Errorf("command %q args %q: want the image's lean runner binary", c.Command, c.Args)
				}
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--provider-mirror") {
						t.Errorf("unexpected %s", a)
					}
				}
				want := DefaultResources()
				if !c.Resources.Requests.Memory().Equal(*want.Requests.Memory()) || !c.Resources.Limits.Memory().Equal(*want.Limits.Memory()) {
					t.Errorf("resources = %v, want defaults", c.Resources)
				}
				if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
					t.Errorf("restartPolicy = %s", pod.Spec.RestartPolicy)
				}
				if pod.Spec.AutomountServiceAccountToken == nil || !*pod.Spec.AutomountServiceAccountToken {
					t.Error("the service account token must be mounted")
				}
				if g := *pod.Spec.TerminationGracePeriodSeconds; g <= int64(interruptGrace/time.Second) {
					t.Errorf("grace period %ds leaves tofu no time after its %s interrupt grace", g, interruptGrace)
				}
				// 20m run + 5m start + 150s grace.
				if d := *pod.Spec.ActiveDeadlineSeconds; d != 20*60+5*60+150 {
					t.Errorf("activeDeadlineSeconds = %d", d)
				}
				if ip, _ := envValue(c, "POD_IP"); ip.ValueFrom == nil || ip.ValueFrom.FieldRef.FieldPath != "status.podIP" {
					t.Errorf("POD_IP = %+v, want the downward API's status.podIP", ip)
				}
				if len(pod.Spec.NodeSelector) != 0 || pod.Spec.Affinity != nil || len(pod.Spec.Tolerations) != 0 || len(pod.Annotations) != 0 {
					t.Errorf("no scheduling bits or annotations expected: %+v", pod.Spec)
				}
			},
		},
		{
			name: "security context is restricted",
			check: func(t *testing.T, pod *corev1.Pod) {
				psc := pod.Spec.SecurityContext
				if !*psc.RunAsNonRoot || *psc.RunAsUser == 0 || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || *psc.FSGroup != *psc.RunAsUser {
					t.Errorf("pod security context = %+v", psc)
				}
				sc := container(pod).SecurityContext
				if !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || *sc.Privileged || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("container security context = %+v", sc)
				}
				if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
					t.Errorf("capabilities = %+v, want drop ALL", sc.Capabilities)
				}
				// Read-only root: every writable path is an emptyDir.
				mounts := map[string]string{}
				for _, m := range container(pod).VolumeMounts {
					mounts[m.MountPath] = m.Name
				}
				vols := map[string]corev1.Volume{}
				for _, v := range pod.Spec.Volumes {
					vols[v.Name] = v
				}
				for _, path := range []string{workMountPath, tmpMountPath} {
					if v, ok := vols[mounts[path]]; !ok || v.EmptyDir == nil {
						t.Errorf("%s is not an emptyDir", path)
					}
				}
				home, _ := envValue(container(pod), "HOME")
				tmp, _ := envValue(container(pod), "TMPDIR")
				if home.Value != workMountPath || tmp.Value != tmpMountPath {
					t.Errorf("HOME=%q TMPDIR=%q must be writable mounts", home.Value, tmp.Value)
				}
				tls := vols[mounts[tlsMountPath]]
				if tls.Secret == nil || tls.Secret.SecretName != "web-runner-r1-tls" || *tls.Secret.DefaultMode != 0o440 {
					t.Errorf("TLS volume = %+v", tls)
				}
			},
		},
		{
			name: "labels and owner",
			check: func(t *testing.T, pod *corev1.Pod) {
				want := map[string]string{LabelStack: "web", LabelRun: "r1", LabelManagedBy: "terrace", LabelComponent: "runner"}
				for k, v := range want {
					if pod.Labels[k] != v {
						t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
					}
				}
				if pod.Name != "web-runner-r1" || pod.Namespace != "team-a" {
					t.Errorf("pod %s/%s", pod.Namespace, pod.Name)
				}
				if len(pod.OwnerReferences) != 1 {
					t.Fatalf("owners = %+v", pod.OwnerReferences)
				}
				o := pod.OwnerReferences[0]
				if o.Kind != "Stack" || o.APIVersion != "terrace.dev/v1alpha1" || o.Name != "web" || o.UID != "stack-uid" || !*o.Controller || *o.BlockOwnerDeletion {
					t.Errorf("owner = %+v, want the Stack as controller without blocking its deletion", o)
				}
			},
		},
		{
			name: "no probe, the health port named",
			check: func(t *testing.T, pod *corev1.Pod) {
				c := container(pod)
				if c.ReadinessProbe != nil || c.StartupProbe != nil {
					t.Errorf("probes: readiness %+v, startup %+v: the kubelet would probe every pod for nobody", c.ReadinessProbe, c.StartupProbe)
				}
				ports := map[string]int32{}
				for _, cp := range c.Ports {
					ports[cp.Name] = cp.ContainerPort
				}
				if ports[healthPortNm] != 9091 || ports[grpcPortName] != 9090 {
					t.Errorf("ports = %v", ports)
				}
				if c.LivenessProbe != nil {
					t.Error("a liveness probe could kill tofu mid-apply")
				}
			},
		},
		{
			name: "resolved config values",
			spec: func(s *RunSpec) {
				s.Image = "registry.example/terrace-tf:1.11"
				s.Binary = terracev1.BinaryTerraform
				s.ServiceAccountName = "deployer"
				s.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}}
				s.Env = []corev1.EnvVar{{Name: "AWS_REGION", Value: "eu-west-1"}}
				s.ProviderMirror = "/mirror"
				s.Timeout = time.Hour
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := container(pod)
				if c.Image != "registry.example/terrace-tf:1.11" || pod.Spec.ServiceAccountName != "deployer" {
					t.Errorf("image %q sa %q", c.Image, pod.Spec.ServiceAccountName)
				}
				if !hasArg(c, "--binary=terraform") || !hasArg(c, "--provider-mirror=/mirror") {
					t.Errorf("args = %q", c.Args)
				}
				if q := c.Resources.Limits[corev1.ResourceMemory]; q.String() != "4Gi" || len(c.Resources.Requests) != 0 {
					t.Errorf("resources = %+v, want exactly the spec's", c.Resources)
				}
				if e, _ := envValue(c, "AWS_REGION"); e.Value != "eu-west-1" {
					t.Errorf("env = %+v", c.Env)
				}
				if d := *pod.Spec.ActiveDeadlineSeconds; d != 3600+300+150 {
					t.Errorf("activeDeadlineSeconds = %d", d)
				}
			},
		},
		{
			name: "Stack template overrides and extends",
			spec: func(s *RunSpec) {
				s.Stack.Spec.Timeout = &metav1.Duration{Duration: 2 * time.Minute}
				s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{
					NodeSelector: map[string]string{"pool": "infra"},
					Tolerations:  []corev1.Toleration{{Key: "infra", Operator: corev1.TolerationOpExists}},
					Affinity:     &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}},
					Volumes:      []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}}},
					VolumeMounts: []corev1.VolumeMount{{Name: "creds", MountPath: "/creds"}},
					EnvFrom:      []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cloud"}}}},
					Labels:       map[string]string{"team": "a"},
					Annotations:  map[string]string{"note": "x"},
				}
				// A config/Stack variable may move HOME but not the address the runner binds.
				s.Env = []corev1.EnvVar{{Name: "HOME", Value: "/creds"}, {Name: "POD_IP", Value: "1.2.3.4"}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				if pod.Spec.NodeSelector["pool"] != "infra" || len(pod.Spec.Tolerations) != 1 || pod.Spec.Affinity == nil {
					t.Errorf("scheduling = %+v", pod.Spec)
				}
				if pod.Labels["team"] != "a" || pod.Annotations["note"] != "x" {
					t.Errorf("user labels/annotations missing: %v %v", pod.Labels, pod.Annotations)
				}
				if pod.Labels[LabelRun] != "r1" || pod.Labels[LabelManagedBy] != "terrace" {
					t.Errorf("terrace's own labels must win: %v", pod.Labels)
				}
				c := container(pod)
				if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef.Name != "cloud" {
					t.Errorf("envFrom = %+v", c.EnvFrom)
				}
				if len(pod.Spec.Volumes) != 4 || pod.Spec.Volumes[3].Name != "creds" || len(c.VolumeMounts) != 4 || c.VolumeMounts[3].MountPath != "/creds" {
					t.Errorf("volumes %+v mounts %+v", pod.Spec.Volumes, c.VolumeMounts)
				}
				if home, i := envValue(c, "HOME"); home.Value != "/creds" || i != len(c.Env)-1 {
					t.Errorf("HOME = %+v at %d, want the override, once, last", home, i)
				}
				count := 0
				for _, e := range c.Env {
					if e.Name == "POD_IP" {
						count++
						if e.ValueFrom == nil {
							t.Error("POD_IP must stay the downward API value")
						}
					}
				}
				if count != 1 {
					t.Errorf("POD_IP defined %d times", count)
				}
				// spec.timeout 2m + 5m start + 150s grace.
				if d := *pod.Spec.ActiveDeadlineSeconds; d != 120+300+150 {
					t.Errorf("activeDeadlineSeconds = %d, want from the Stack's timeout", d)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLauncher(t)
			spec := RunSpec{Stack: testStack(), RunID: "r1"}
			if tt.spec != nil {
				tt.spec(&spec)
			}
			p, err := l.plan(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, buildPod(p))
		})
	}
}

func TestTimeoutFromContextDeadline(t *testing.T) {
	l := testLauncher(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p, err := l.plan(ctx, RunSpec{Stack: testStack(), RunID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	d := *buildPod(p).Spec.ActiveDeadlineSeconds
	if d > 600+300+150 || d < 590+300+150 {
		t.Errorf("activeDeadlineSeconds = %d, want about ctx's 10m + 5m start + 150s", d)
	}
}

func TestInvalidRunSpec(t *testing.T) {
	tests := []struct {
		name string
		spec func(*RunSpec)
		want string
	}{
		{"no UID", func(s *RunSpec) { s.Stack.UID = "" }, "UID"},
		{"bad run ID", func(s *RunSpec) { s.RunID = "Run_1" }, "run ID"},
		{"long run ID", func(s *RunSpec) { s.RunID = strings.Repeat("a", 41) }, "run ID"},
		{"bad binary", func(s *RunSpec) { s.Binary = "pulumi" }, "binary"},
		{"reserved volume", func(s *RunSpec) {
			s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: tlsVolume}}}
		}, "reserved"},
		{"mount over the TLS directory", func(s *RunSpec) {
			s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{VolumeMounts: []corev1.VolumeMount{{Name: "x", MountPath: "/etc/terrace"}}}
		}, "overlaps"},
		{"mount inside the work directory", func(s *RunSpec) {
			s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{VolumeMounts: []corev1.VolumeMount{{Name: "x", MountPath: "/var/lib/terrace/work/cache/"}}}
		}, "overlaps"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLauncher(t)
			spec := RunSpec{Stack: testStack(), RunID: "r1"}
			tt.spec(&spec)
			_, err := l.plan(context.Background(), spec)
			if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidSpec mentioning %q", err, tt.want)
			}
		})
	}
	l := testLauncher(t)
	l.opts.DefaultImage = ""
	if _, err := l.plan(context.Background(), RunSpec{Stack: testStack(), RunID: "r1"}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("no image: err = %v", err)
	}
}

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 40) + "." + strings.Repeat("b", 100)
	for _, stack := range []string{"web", "my.stack", long, strings.Repeat("c", 60)} {
		name := PodName(stack, "abcd1234")
		if errs := validation.IsDNS1123Label(name); len(errs) != 0 {
			t.Errorf("PodName(%q) = %q: %v", stack, name, errs)
		}
		if errs := validation.IsDNS1123Label(secretName(name)); len(errs) != 0 && len(secretName(name)) > 253 {
			t.Errorf("secret name %q: %v", secretName(name), errs)
		}
		if errs := validation.IsValidLabelValue(StackLabelValue(stack)); len(errs) != 0 {
			t.Errorf("StackLabelValue(%q) = %q: %v", stack, StackLabelValue(stack), errs)
		}
	}
	if PodName("web", "r1") != "web-runner-r1" || StackLabelValue("web") != "web" {
		t.Error("short names must stay readable")
	}
	if PodName(long, "r1") == PodName(long+"x", "r1") || StackLabelValue(long) == StackLabelValue(long+"x") {
		t.Error("shortened names of different Stacks collide")
	}
	seen := map[string]bool{}
	for range 100 {
		id := NewRunID()
		if !runIDPattern.MatchString(id) || len(id) != 8 || seen[id] {
			t.Fatalf("NewRunID() = %q", id)
		}
		seen[id] = true
	}
}

func TestTerminated(t *testing.T) {
	code := func(c int32) *int32 { return &c }
	withContainer := func(phase corev1.PodPhase, podReason string, state corev1.ContainerState) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: phase, Reason: podReason, ContainerStatuses: []corev1.ContainerStatus{{Name: containerName, State: state}}}}
	}
	now := metav1.Now()
	tests := []struct {
		name       string
		pod        *corev1.Pod
		deleted    bool
		wantReason string
		wantCode   *int32
	}{
		{"pending", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, false, "", nil},
		{"running", withContainer(corev1.PodRunning, "", corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}), false, "", nil},
		{"image pull back-off keeps waiting", withContainer(corev1.PodPending, "", corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}), false, "", nil},
		{"invalid image never starts", withContainer(corev1.PodPending, "", corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "InvalidImageName"}}), false, "InvalidImageName", nil},
		{"OOM killed before the phase changes", withContainer(corev1.PodRunning, "", corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}), false, "OOMKilled", code(137)},
		{"exited with an error", withContainer(corev1.PodFailed, "", corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1}}), false, "Error", code(1)},
		{"evicted", withContainer(corev1.PodFailed, "Evicted", corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 137}}), false, "Evicted", code(137)},
		{"deadline without container status", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded"}}, false, "DeadlineExceeded", nil},
		{"failed without reason", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}, false, "Failed", nil},
		{"image without terrace-runner", withContainer(corev1.PodFailed, "", corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "StartError", ExitCode: 128,
			Message: `exec: "/usr/local/bin/terrace-runner": stat /usr/local/bin/terrace-runner: no such file or directory`}}), false, "StartError", code(128)},
		{"succeeded", withContainer(corev1.PodSucceeded, "", corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}), false, "Completed", code(0)},
		{"being deleted", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}, false, "Deleted", nil},
		{"deleted", &corev1.Pod{}, true, "Deleted", nil},
		{"gone", nil, true, "Deleted", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := terminated("ns/p", tt.pod, tt.deleted)
			if tt.wantReason == "" {
				if got != nil {
					t.Fatalf("terminated = %v, want alive", got)
				}
				return
			}
			if got == nil || got.Reason != tt.wantReason {
				t.Fatalf("terminated = %v, want reason %s", got, tt.wantReason)
			}
			if (tt.wantCode == nil) != (got.ExitCode == nil) || (tt.wantCode != nil && *tt.wantCode != *got.ExitCode) {
				t.Errorf("exit code = %v, want %v", got.ExitCode, tt.wantCode)
			}
			if strings.Contains(got.Message, "terrace-runner") && !strings.Contains(got.Message, "use the Terrace image of the controller's version") {
				t.Errorf("a runner image without terrace-runner gets no hint: %q", got.Message)
			}
			if !strings.Contains(got.Error(), "ns/p") || !strings.Contains(got.Error(), tt.wantReason) {
				t.Errorf("message %q", got.Error())
			}
		})
	}
}

func TestCreateErrorsAreExplained(t *testing.T) {
	p := podParams{spec: RunSpec{Stack: &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team"}}, ServiceAccountName: "deployer"}}
	podsGR := schema.GroupResource{Resource: "pods"}
	missingSA := apierrors.NewForbidden(podsGR, "web-runner-1", errors.New(`error looking up service account team/deployer: serviceaccount "deployer" not found`))
	if got := explainCreateError(missingSA, p).Error(); !strings.Contains(got, `create ServiceAccount "deployer" in namespace "team"`) {
		t.Errorf("missing ServiceAccount: %s", got)
	}
	// An RBAC denial of the controller's own account is not about the runner's.
	rbac := apierrors.NewForbidden(podsGR, "", errors.New(`User "system:serviceaccount:terrace-system:terrace-controller" cannot create resource "pods" in API group "" in the namespace "team"`))
	if got := explainCreateError(rbac, p); strings.Contains(got.Error(), "create ServiceAccount") || !apierrors.IsForbidden(got) {
		t.Errorf("RBAC denial: %v", got)
	}
}

// The Secret of spec.source.git.secretRef is mounted read-only, and only
// when set; such a Stack gets a pod of its own, never a warm one.
func TestGitCredentialsAreMountedOnlyWhenSet(t *testing.T) {
	l := testLauncher(t)
	mounted := func(spec RunSpec) *corev1.VolumeMount {
		p, err := l.plan(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		pod := buildPod(p)
		for _, m := range container(pod).VolumeMounts {
			if m.MountPath == GitCredentialsPath {
				for _, v := range pod.Spec.Volumes {
					if v.Name == m.Name && (v.Secret == nil || v.Secret.SecretName != "git-creds" || *v.Secret.DefaultMode != 0o440) {
						t.Fatalf("volume %+v is not the Secret git-creds, mode 0440", v)
					}
				}
				return &m
			}
		}
		return nil
	}
	plain := testStack()
	plain.Spec.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "https://git.example.com/x.git"}}
	if m := mounted(RunSpec{Stack: plain, RunID: "r1"}); m != nil {
		t.Fatalf("a Git source without secretRef mounts %+v", m)
	}
	if _, ok := Class(RunSpec{Stack: plain}); !ok {
		t.Fatal("a Git source without credentials may use a warm pod")
	}
	withCreds := plain.DeepCopy()
	withCreds.Spec.Source.Git.SecretRef = &terracev1.LocalObjectReference{Name: "git-creds"}
	if m := mounted(RunSpec{Stack: withCreds, RunID: "r1"}); m == nil || !m.ReadOnly {
		t.Fatalf("credentials mount %+v, want read-only at %s", m, GitCredentialsPath)
	}
	if _, ok := Class(RunSpec{Stack: withCreds}); ok {
		t.Fatal("a Stack with Git credentials was given a warm runner class")
	}
}

func TestForgeCredentialsAreMountedOnlyForTheRunThatAsks(t *testing.T) {
	l := testLauncher(t)
	stack := testStack()
	stack.Spec.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "https://git.example.com/x.git", SecretRef: &terracev1.LocalObjectReference{Name: "git-creds"}}}
	mounts := func(spec RunSpec) map[string]string {
		p, err := l.plan(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		pod := buildPod(p)
		secrets := map[string]string{}
		for _, v := range pod.Spec.Volumes {
			if v.Secret != nil {
				secrets[v.Name] = v.Secret.SecretName
			}
		}
		got := map[string]string{}
		for _, m := range container(pod).VolumeMounts {
			if name, ok := secrets[m.Name]; ok && m.ReadOnly && m.MountPath != tlsMountPath {
				got[m.MountPath] = name
			}
		}
		return got
	}
	if got := mounts(RunSpec{Stack: stack, RunID: "r1"}); len(got) != 1 || got[GitCredentialsPath] != "git-creds" {
		t.Fatalf("an ordinary run mounts %v, want only the git credentials", got)
	}
	if got := mounts(RunSpec{Stack: stack, RunID: "r1", ReadOnly: true, ForgeSecretName: "forge-token", NoGitCredentials: true}); len(got) != 1 || got[ForgeCredentialsPath] != "forge-token" {
		t.Fatalf("a forge run mounts %v, want only the forge token at %s", got, ForgeCredentialsPath)
	}
}

// A runner container the OOM killer stopped says what to raise, with the
// container's limit: the runner itself died, so no tofu error says it.
func TestTerminatedByTheOOMKillerNamesTheLimit(t *testing.T) {
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("6Mi")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: containerName,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}},
	}
	got := terminated("oom/small-runner-x", pod, false).Error()
	for _, want := range []string{"OOMKilled (exit code 137)", "out-of-memory killer", "6 MiB", "spec.runner.resources.limits.memory"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
