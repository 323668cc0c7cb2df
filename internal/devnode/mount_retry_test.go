package devnode

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestALateSecretIsReportedOnlyWhenItStaysMissing checks that a volume's
// Secret made just after its pod costs quick retries and no status, while
// one that stays missing shows in the containers' waiting message.
func TestALateSecretIsReportedOnlyWhenItStaysMissing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		misses   int // GETs answered NotFound before the Secret is there
		reported bool
	}{
		{name: "there by the third look", misses: 2, reported: false},
		{name: "missing for six looks", misses: 6, reported: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tls"}, Data: map[string][]byte{"k": []byte("v")}}
			cs := fake.NewClientset(secret)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"},
				Spec: corev1.PodSpec{
					HostNetwork: true,
					Containers:  []corev1.Container{{Name: "main", Image: "terrace"}},
					Volumes:     []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls"}}}},
				},
			}
			w := newPodWorker(&Node{client: cs, log: logr.Discard(), opts: Options{Dir: t.TempDir()}}, pod)
			gets, reported := 0, false
			cs.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
				w.mu.Lock()
				for _, c := range w.state.containers {
					reported = reported || c.waitingMessage != ""
				}
				w.mu.Unlock()
				if gets++; gets <= tc.misses {
					return true, nil, apierrors.NewNotFound(corev1.Resource("secrets"), "tls")
				}
				return false, nil, nil
			})
			if _, ok := w.setUpSandbox(context.Background(), pod); !ok {
				t.Fatal("the sandbox did not come up")
			}
			// One GET per miss, and the one that finds it.
			if gets != tc.misses+1 {
				t.Fatalf("%d GETs of the Secret, want %d", gets, tc.misses+1)
			}
			if reported != tc.reported {
				t.Fatalf("mount failure reported in the status: %v, want %v", reported, tc.reported)
			}
			if !w.state.sandboxReady {
				t.Fatal("the sandbox is not marked ready")
			}
		})
	}
}

// TestAPrefetchsMissIsNotReadAgain checks that a resolution reads a missing
// Secret once: the prefetch's miss answers the volume's own lookup.
func TestAPrefetchsMissIsNotReadAgain(t *testing.T) {
	cs := fake.NewClientset()
	gets := 0
	cs.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil
	})
	src := newObjectSource(cs, "ns")
	src.prefetch(context.Background(), []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls"}}}})
	_, err := src.secret(context.Background(), "tls", nil)
	var missing *configError
	if !errors.As(err, &missing) {
		t.Fatalf("a missing Secret gave %v, want a configError", err)
	}
	if gets != 1 {
		t.Fatalf("%d GETs of the missing Secret, want 1", gets)
	}
}
