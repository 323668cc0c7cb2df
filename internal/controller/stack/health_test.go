package stack

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// Every run that applies nothing checks health, whatever the conditions
// say: HealthCheckPassed is the last check's result, not a record that
// decides the next one.
func TestHealthIsCheckedAtEveryRunThatAppliesNothing(t *testing.T) {
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	s := &scope{stack: stack}
	if healthDue(s) {
		t.Fatal("a Stack without health checks is due a check")
	}
	stack.Spec.HealthChecks = []terracev1.HealthCheck{{Name: "web", Type: "tcp", Address: "db:5432"}}
	outcome.MarkTrue(stack, terracev1.HealthCheckPassedCondition, HealthCheckPassedReason, "1 health check(s) passed")
	if !healthDue(s) {
		t.Fatal("a Stack whose checks passed at this generation is not checked again")
	}
	s.observed.health = &healthObservation{}
	if healthDue(s) {
		t.Fatal("a run that already checked health checks again")
	}
}
