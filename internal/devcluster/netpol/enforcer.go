package netpol

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

const (
	defaultDebounce = 100 * time.Millisecond
	// A failed apply is retried after retryBase, doubled per failure up to
	// retryMax, or sooner when the cluster changes.
	retryBase = 500 * time.Millisecond
	retryMax  = 30 * time.Second
)

// Enforcer keeps a node's table inet terrace-netpol in step with the
// cluster's Pods, Namespaces and NetworkPolicies. The zero value is ready
// to Run.
type Enforcer struct {
	// Debounce is how long the Enforcer gathers changes after the first
	// one before it compiles the rules; 100 ms when zero.
	Debounce time.Duration
}

// Run watches the cluster cfg points at and calls apply with the whole
// ruleset (see Compile) once its caches have synced and again after every
// burst of changes that alters the ruleset. apply is expected to load the
// text with `nft -f -` in the node's network namespace. A failed apply is
// logged and retried with backoff. Run returns nil when ctx ends, and an
// error only when it cannot start watching.
func (e *Enforcer) Run(ctx context.Context, cfg *rest.Config, apply func(ctx context.Context, ruleset string) error) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create the network policy enforcer's client: %w", err)
	}
	return e.run(ctx, client, apply)
}

func (e *Enforcer) run(ctx context.Context, client kubernetes.Interface, apply func(ctx context.Context, ruleset string) error) error {
	log := logr.FromContextOrDiscard(ctx).WithName("netpol")
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields))
	// Shutdown waits for the informers, which stop when ctx is cancelled:
	// cancel runs first.
	defer factory.Shutdown()
	defer cancel()

	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	pods := factory.Core().V1().Pods()
	namespaces := factory.Core().V1().Namespaces()
	policies := factory.Networking().V1().NetworkPolicies()
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), namespaces.Informer(), policies.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("failed to watch for network policy changes: %w", err)
		}
	}
	factory.StartWithContext(ctx)
	if err := factory.WaitForCacheSyncWithContext(ctx).AsError(); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("failed to list pods, namespaces and network policies: %w", err)
	}
	log.V(1).Info("watching network policies")

	compile := func() (string, error) {
		podList, err := pods.Lister().List(labels.Everything())
		if err != nil {
			return "", err
		}
		nsList, err := namespaces.Lister().List(labels.Everything())
		if err != nil {
			return "", err
		}
		npList, err := policies.Lister().List(labels.Everything())
		if err != nil {
			return "", err
		}
		return Compile(values(podList), values(nsList), values(npList)), nil
	}

	debounce := e.Debounce
	if debounce <= 0 {
		debounce = defaultDebounce
	}
	var applied string
	failures := 0
	// The first compile follows the caches' sync at once.
	timer := time.NewTimer(0)
	defer timer.Stop()
	pending := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			if !pending {
				pending = true
				timer.Reset(debounce)
			}
		case <-timer.C:
			pending = false
			ruleset, err := compile()
			if err == nil && ruleset == applied {
				continue
			}
			if err == nil {
				err = apply(ctx, ruleset)
			}
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				failures++
				delay := min(retryBase<<min(failures-1, 10), retryMax)
				log.Error(err, "failed to apply the network policy rules", "failures", failures, "retryIn", delay)
				pending = true
				timer.Reset(delay)
				continue
			}
			failures = 0
			applied = ruleset
			log.V(1).Info("applied the network policy rules", "bytes", len(ruleset))
		}
	}
}

// values copies the listers' objects into the slices Compile takes.
func values[T any](items []*T) []T {
	out := make([]T, len(items))
	for i, item := range items {
		out[i] = *item
	}
	return out
}

// stripManagedFields drops what the enforcer never reads from the cached
// objects, which on pods is most of their size.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
