// The Go peer of the benchmark: the Task controller written with sigs.k8s.io/controller-runtime,
// doing what controllers/task.py does, so that `python -m bench` can run the same scenarios
// against both on the same control plane.
//
// Modes (-mode):
//
//	normal       derive status.state/observedGeneration/the Overdue condition; write the status
//	             (a merge patch of the status subresource, conditioned on the resourceVersion
//	             read) only when it changes; reconcile on spec changes (GenerationChanged).
//	write-heavy  every reconcile writes: the derived status plus a "Bench" condition whose
//	             message counts the writes of this run ("<stamp>/<n>"), until n reaches -rounds.
//	             No predicate, so each status write comes back as an event and is reconciled.
//
// Settings that matter for a fair comparison with the Python controller: the cache is limited
// to -namespace, managedFields are stripped before caching (the Python informer's default
// transform), -workers sets MaxConcurrentReconciles, probes are off unless
// -health-probe-bind-address is given (the startup scenario polls /readyz), metrics are off
// unless -metrics-bind-address is given (the restart scenario scrapes them), no leader election.
// controller-runtime leaves client-side rate limiting off (QPS -1) by default.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"controller-runtime-py.invalid/bench/peer/api"
)

// ---- the reconciler ----

const wakeMargin = 50 * time.Millisecond

type reconciler struct {
	client     client.Client
	writeHeavy bool
	stamp      string
	rounds     int
}

// deriveStatus mirrors controllers/task.py:derive_status.
func deriveStatus(task *api.Task, now time.Time) (api.TaskStatus, time.Duration) {
	status := copyStatus(&task.Status)
	desired := task.Spec.TaskState
	if desired == "" {
		desired = "Pending"
	}
	var wake time.Duration
	open := desired == "Pending" || desired == "InProgress"
	var deadline time.Time
	hasDeadline := false
	if task.Spec.Deadline != "" {
		if parsed, err := time.Parse(time.RFC3339, task.Spec.Deadline); err == nil {
			deadline, hasDeadline = parsed, true
		}
	}
	state, overdue := desired, false
	var reason, message string
	switch {
	case !open:
		reason, message = "Closed", "the task is "+desired
	case hasDeadline && !now.Before(deadline):
		state, overdue, reason = "Overdue", true, "DeadlinePassed"
		message = "the deadline " + task.Spec.Deadline + " has passed"
	case !hasDeadline:
		reason, message = "NoDeadline", "the task has no deadline"
	default:
		reason, message = "OnTime", "due "+task.Spec.Deadline
		wake = deadline.Sub(now) + wakeMargin
	}
	conditionStatus := metav1.ConditionFalse
	if overdue {
		conditionStatus = metav1.ConditionTrue
	}
	status.State = state
	status.ObservedGeneration = task.Generation
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type:               "Overdue",
		Status:             conditionStatus,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: task.Generation,
		LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
	})
	return status, wake
}

// copyStatus is a deep copy, so deriveStatus never mutates the object read from the cache.
func copyStatus(in *api.TaskStatus) api.TaskStatus {
	var out api.TaskStatus
	in.DeepCopyInto(&out)
	return out
}

func benchCount(status *api.TaskStatus, stamp string) int {
	condition := meta.FindStatusCondition(status.Conditions, "Bench")
	if condition == nil {
		return 0
	}
	prefix, count, found := strings.Cut(condition.Message, "/")
	if !found || prefix != stamp {
		return 0
	}
	n, err := strconv.Atoi(count)
	if err != nil {
		return 0
	}
	return n
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	task := &api.Task{}
	if err := r.client.Get(ctx, req.NamespacedName, task); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	now := time.Now().UTC()
	status, wake := deriveStatus(task, now)
	write := !equality.Semantic.DeepEqual(status, task.Status)
	if r.writeHeavy {
		written := benchCount(&task.Status, r.stamp)
		if written >= r.rounds {
			return ctrl.Result{}, nil
		}
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type:               "Bench",
			Status:             metav1.ConditionTrue,
			Reason:             "WriteHeavy",
			Message:            fmt.Sprintf("%s/%d", r.stamp, written+1),
			ObservedGeneration: task.Generation,
			LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
		})
		// SetStatusCondition keeps the message change but not a new transition time.
		write = true
	}
	if write {
		original := task.DeepCopy()
		task.Status = status
		patch := client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{})
		if err := r.client.Status().Patch(ctx, task, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	if wake > 0 {
		return ctrl.Result{RequeueAfter: wake}, nil
	}
	return ctrl.Result{}, nil
}

func main() {
	namespace := flag.String("namespace", "", "the only namespace to watch (required)")
	mode := flag.String("mode", "normal", "normal or write-heavy")
	stamp := flag.String("stamp", "", "write-heavy: the run's stamp")
	rounds := flag.Int("rounds", 1, "write-heavy: status writes per object")
	workers := flag.Int("workers", 1, "MaxConcurrentReconciles")
	cacheSyncTimeout := flag.Duration("cache-sync-timeout", 2*time.Minute,
		"CacheSyncTimeout: how long the initial list may take (the harness passes its "+
			"--timeout: a million objects take longer than the default 2m)")
	metricsAddr := flag.String("metrics-bind-address", "0",
		"the Prometheus endpoint (host:port; \"0\" = off); the restart scenario scrapes it")
	probeAddr := flag.String("health-probe-bind-address", "0",
		"/healthz and /readyz (host:port; \"0\" = off); ready once the cache has synced, as "+
			"the Python manager's /readyz (the startup scenario polls it)")
	flag.Parse()
	if *namespace == "" {
		fmt.Fprintln(os.Stderr, "-namespace is required")
		os.Exit(2)
	}
	// Errors only (failed reconciles, conflicts), as the Python implementations log at WARNING.
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))

	scheme := runtime.NewScheme()
	if err := api.AddToScheme(scheme); err != nil {
		panic(err)
	}
	cfg := ctrl.GetConfigOrDie()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{*namespace: {}},
			DefaultTransform:  cache.TransformStripManagedFields(),
		},
		Metrics:                server.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress: *probeAddr,
		LeaderElection:         false,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
	// Ready once the Task informer has synced (the cache alone reports synced before the
	// controller has started its informer).
	if err := mgr.AddReadyzCheck("informers-synced", func(req *http.Request) error {
		informer, err := mgr.GetCache().GetInformer(
			req.Context(), &api.Task{}, cache.BlockUntilSynced(false))
		if err != nil {
			return err
		}
		if !informer.HasSynced() {
			return errors.New("the Task informer has not synced")
		}
		return nil
	}); err != nil {
		fmt.Fprintln(os.Stderr, "readyz:", err)
		os.Exit(1)
	}
	r := &reconciler{
		client:     mgr.GetClient(),
		writeHeavy: *mode == "write-heavy",
		stamp:      *stamp,
		rounds:     *rounds,
	}
	var predicates []predicate.Predicate
	if !r.writeHeavy {
		predicates = append(predicates, predicate.GenerationChangedPredicate{})
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("task").
		For(&api.Task{}, builder.WithPredicates(predicates...)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: *workers,
			CacheSyncTimeout:        *cacheSyncTimeout,
		}).
		Complete(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped:", err)
		os.Exit(1)
	}
}
