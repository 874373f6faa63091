// The client-go peer of the core scenario (bench/core.py): client-go's own informer, fed the
// recorded list+watch stream that the harness serves over loopback HTTP (bench/core_server.py),
// so that it does the same work on the same bytes as the Python informer beside it.
//
// What runs is what controller-runtime's cache builds for one kind: a SharedIndexInformer
// (Reflector -> DeltaFIFO -> thread-safe indexed store, with the namespace index) over a typed
// Task REST client (JSON, the scheme's codecs), with managedFields stripped by the informer's
// transform (as cache.TransformStripManagedFields does, and as the Python informer does by
// default). Stages (-stage):
//
//	informer    an event handler that counts the events it is handed.
//	controller  the handler enqueues each object's namespace/name into a rate-limiting
//	            workqueue (controller-runtime's default rate limiter); -workers goroutines take
//	            each key, run a no-op reconcile, Forget and Done it.
//
// The reflector lists and watches as client-go does by default, except that the streaming list
// (WatchListClient) is turned off by the harness (KUBE_FEATURE_WatchListClient=false), so that
// both implementations take the same path: an empty LIST, then a watch whose events are the N
// recorded objects.
//
// It prints one JSON line: seconds from starting the informer to the N-th event handled (or
// reconciled), the process's CPU seconds in that window, its RSS growth, the live heap after a
// forced GC, its peak RSS, and how many objects the store holds.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"controller-runtime-py.invalid/bench/peer/api"
)

func rss() int64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(raw))
	pages, _ := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

func peakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kib, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kib * 1024
		}
	}
	return 0
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return seconds(usage.Utime) + seconds(usage.Stime)
}

// stripManagedFields is controller-runtime's cache.TransformStripManagedFields.
func stripManagedFields(in any) (any, error) {
	if obj, err := meta.Accessor(in); err == nil && obj.GetManagedFields() != nil {
		obj.SetManagedFields(nil)
	}
	return in, nil
}

func main() {
	server := flag.String("server", "", "the harness's recorded-stream server, http://127.0.0.1:PORT")
	objects := flag.Int64("objects", 0, "the number of objects in the recorded stream")
	stage := flag.String("stage", "informer", "informer or controller")
	workers := flag.Int("workers", 1, "controller: reconcile goroutines")
	flag.Parse()
	if *server == "" || *objects <= 0 || (*stage != "informer" && *stage != "controller") {
		fmt.Fprintln(os.Stderr, "usage: core-peer -server URL -objects N [-stage informer|controller]")
		os.Exit(2)
	}
	n := *objects

	scheme := kruntime.NewScheme()
	if err := api.AddToScheme(scheme); err != nil {
		panic(err)
	}
	config := &rest.Config{
		Host:    *server,
		APIPath: "/apis",
		ContentConfig: rest.ContentConfig{
			GroupVersion:         &api.GroupVersion,
			NegotiatedSerializer: serializer.NewCodecFactory(scheme).WithoutConversion(),
			ContentType:          "application/json",
		},
		QPS: -1,
	}
	client, err := rest.RESTClientFor(config)
	if err != nil {
		panic(err)
	}
	watchlist := cache.NewListWatchFromClient(client, "tasks", metav1.NamespaceAll, fields.Everything())
	informer := cache.NewSharedIndexInformer(watchlist, &api.Task{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := informer.SetTransform(stripManagedFields); err != nil {
		panic(err)
	}

	done := make(chan struct{})
	var counted atomic.Int64
	count := func() {
		if counted.Add(1) == n {
			close(done)
		}
	}
	var queue workqueue.TypedRateLimitingInterface[types.NamespacedName]
	enqueue := func(obj any) {
		if task, ok := obj.(*api.Task); ok {
			queue.Add(types.NamespacedName{Namespace: task.Namespace, Name: task.Name})
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { count() }}
	if *stage == "controller" {
		queue = workqueue.NewTypedRateLimitingQueue(
			workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]())
		handler = cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
		}
		for range *workers {
			go func() {
				for {
					key, quit := queue.Get()
					if quit {
						return
					}
					// The no-op reconcile.
					queue.Forget(key)
					queue.Done(key)
					count()
				}
			}()
		}
	}
	if _, err := informer.AddEventHandler(handler); err != nil {
		panic(err)
	}

	stop := make(chan struct{})
	baseline := rss()
	cpuStarted := cpuSeconds()
	started := time.Now()
	go informer.Run(stop)
	<-done
	seconds := time.Since(started).Seconds()
	cpu := cpuSeconds() - cpuStarted
	grown := rss() - baseline
	cached := len(informer.GetStore().ListKeys())
	runtime.GC()
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	close(stop)
	if queue != nil {
		queue.ShutDown()
	}
	out, _ := json.Marshal(map[string]any{
		"stage":          *stage,
		"objects":        n,
		"seconds":        seconds,
		"cpu_seconds":    cpu,
		"rss_grown":      grown,
		"heap_after_gc":  stats.HeapAlloc,
		"peak_rss_bytes": peakRSS(),
		"cached":         cached,
		"gomaxprocs":     runtime.GOMAXPROCS(0),
		"go_version":     runtime.Version(),
	})
	fmt.Println(string(out))
}
