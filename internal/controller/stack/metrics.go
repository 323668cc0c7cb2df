package stack

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runphase"
)

var (
	runsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "terrace_runs_total",
		Help: "Runs by kind (plan, apply, drift, destroy) and result (success, failure).",
	}, []string{"kind", "result"})
	runDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "terrace_run_duration_seconds",
		Help:    "Duration of runs, from runner start to result, by kind.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 12),
	}, []string{"kind"})
	runnerStartDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "terrace_runner_start_duration_seconds",
		Help:    "Time from creating a runner pod to a connected, healthy runner.",
		Buckets: prometheus.ExponentialBuckets(0.1, 2, 12),
	})
	driftDetectedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "terrace_drift_detected_total",
		Help: "Drift checks that found changes made outside Terrace, by namespace.",
	}, []string{"namespace"})
	stackReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "terrace_stack_ready",
		Help: "1 when the Stack is Ready, 0 otherwise.",
	}, []string{"namespace", "name"})
	// phaseSeconds is terrace_run_phase_seconds: where runs spend their
	// time. Its labels are bounded: the seven phases and the run kinds.
	phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "terrace_run_phase_seconds",
		Help:    "Duration of each phase of a run (pod, fetch, init, plan, apply, outputs, records), by run kind.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
	}, []string{"phase", "kind"})
	// runnerCPUSeconds and tofuProcesses are what finished runs cost in
	// their pods, as each runner reports it before its pod goes: part
	// "runner" is the runner process, "tofu" the tofu processes it started
	// with their providers.
	runnerCPUSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "terrace_runner_cpu_seconds_total",
		Help: "CPU time of finished runs' runner pods, by part: the runner process, or the tofu processes it started (providers included).",
	}, []string{"part"})
	tofuProcesses = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "terrace_tofu_processes_total",
		Help: "tofu (or terraform) processes started by finished runs.",
	})
	// runSlotsInUse and runsQueued show the run queue, which the
	// conditions show only in part: a Ready Stack whose drift check waits
	// for a slot stays Ready.
	runSlotsInUse = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "terrace_run_slots_in_use",
		Help: "Run slots held by runs or reserved for a woken queued Stack (at most --max-concurrent-runs).",
	})
	runsQueued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "terrace_runs_queued",
		Help: "Stacks whose due run (new inputs, an approved plan, a request, a drift or Git check) waits for a run slot.",
	})
)

func init() {
	metrics.Registry.MustRegister(runsTotal, runDuration, runnerStartDuration, driftDetectedTotal, stackReady, phaseSeconds, runnerCPUSeconds, tofuProcesses, runSlotsInUse, runsQueued)
}

// recordMetrics records the outcome of a reconcile.
func recordMetrics(stack *terracev1.Stack, s *scope, runErr error, seconds float64) {
	if stack.DeletionTimestamp != nil {
		stackReady.DeleteLabelValues(stack.Namespace, stack.Name)
	} else if conditionTrue(stack, terracev1.ReadyCondition) {
		stackReady.WithLabelValues(stack.Namespace, stack.Name).Set(1)
	} else {
		stackReady.WithLabelValues(stack.Namespace, stack.Name).Set(0)
	}
	switch s.observed.kind {
	case runPlan, runApplyPending, runDrift, runDestroy:
		result := "success"
		if runErr != nil {
			result = "failure"
		}
		runsTotal.WithLabelValues(string(s.observed.kind), result).Inc()
		runDuration.WithLabelValues(string(s.observed.kind)).Observe(seconds)
	}
}

// observePhases records every phase of t in terrace_run_phase_seconds
// under the run's kind (plan, apply, drift, destroy).
func observePhases(t *runphase.Timings, kind string) {
	t.Each(func(p runphase.Phase, d time.Duration) {
		phaseSeconds.WithLabelValues(string(p), kind).Observe(d.Seconds())
	})
}

// usageTimeout bounds the question to a finished run's runner.
const usageTimeout = 2 * time.Second

// recordUsage asks a finished run's runner what it cost, for
// terrace_runner_cpu_seconds_total and terrace_tofu_processes_total. A run
// cut short is not asked: its runner may be gone, and its figures would
// miss what tofu did after the question.
func recordUsage(ctx context.Context, s *scope) {
	run := s.run
	if run == nil || run.client == nil || !run.facts.finished {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), usageTimeout)
	defer cancel()
	u, err := run.client.Usage(ctx)
	if err != nil {
		s.log.V(1).Info("the runner did not say what the run cost", "run", run.id, "error", err.Error())
		return
	}
	runnerCPUSeconds.WithLabelValues("runner").Add(u.GetRunnerCpuSeconds())
	runnerCPUSeconds.WithLabelValues("tofu").Add(u.GetTofuCpuSeconds())
	tofuProcesses.Add(float64(u.GetTofuProcesses()))
}
