package e2e

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/test/chart/chartrender"
)

// TestHelmChartRunsAStack installs what `helm install terrace
// charts/terrace -n terrace-system` installs, with default values, on a dev
// cluster: two controller replicas from the image, leader election, and a
// Stack applied through them (test/chart lints the chart and compares it
// with config/default; this shows it runs).
func TestHelmChartRunsAStack(t *testing.T) {
	objects, err := chartrender.Render(testenv.RepoRoot(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var controller *appsv1.Deployment
	for _, o := range objects {
		if o.GetKind() == "Deployment" {
			controller = typed[appsv1.Deployment](t, controller, o)
		}
	}
	if controller == nil {
		t.Fatalf("the chart renders no controller Deployment; it renders %s", kinds(objects))
	}
	if controller.Namespace == "" {
		controller.Namespace = chartrender.Namespace
	}
	runControllerFromImage(t, objects, controller)
}
