// The webhook peer of the benchmark: controller-runtime's webhook server (pkg/webhook) with a
// typed validator of Tasks (admission.WithValidator), making the same decisions as the Python
// webhook of bench/webhook.py, so that `python -m bench --scenarios webhook` can put both
// behind the same API server and time them side by side.
//
// The rules (both implementations): a new Task may not be due in the past (spec.deadline, RFC
// 3339, before now), and its details may not hold the word "forbidden"; a Task of priority 5
// is admitted with a warning. Updates and deletes are admitted.
//
// Settings that matter for a fair comparison: HTTP/1.1 only (what the Python server serves;
// controller-runtime's default would offer h2 to the API server), the serving pair read from
// -cert-dir (tls.crt, tls.key), logging at error level only.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"controller-runtime-py.invalid/bench/peer/api"
)

// Path is controller-runtime's default path of a validating webhook for tasks.crpy.io/v1 Task.
const Path = "/validate-tasks-crpy-io-v1-task"

type taskValidator struct{}

func (taskValidator) ValidateCreate(_ context.Context, task *api.Task) (admission.Warnings, error) {
	if task.Spec.Deadline != "" {
		due, err := time.Parse(time.RFC3339, task.Spec.Deadline)
		if err != nil {
			return nil, fmt.Errorf("spec.deadline: %q is not an RFC 3339 time", task.Spec.Deadline)
		}
		if due.Before(time.Now()) {
			return nil, fmt.Errorf("spec.deadline: a new task cannot be due in the past (%s)", task.Spec.Deadline)
		}
	}
	if strings.Contains(task.Spec.Details, "forbidden") {
		return nil, fmt.Errorf("spec.details: the word \"forbidden\" is not allowed")
	}
	if task.Spec.Priority == 5 {
		return admission.Warnings{"priority 5 pages whoever is on call"}, nil
	}
	return nil, nil
}

func (taskValidator) ValidateUpdate(context.Context, *api.Task, *api.Task) (admission.Warnings, error) {
	return nil, nil
}

func (taskValidator) ValidateDelete(context.Context, *api.Task) (admission.Warnings, error) {
	return nil, nil
}

func main() {
	port := flag.Int("port", 9443, "the HTTPS port (on 127.0.0.1)")
	certDir := flag.String("cert-dir", "", "the directory holding tls.crt and tls.key")
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))

	scheme := runtime.NewScheme()
	if err := api.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server := webhook.NewServer(webhook.Options{
		Host:    "127.0.0.1",
		Port:    *port,
		CertDir: *certDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	})
	server.Register(Path, admission.WithValidator[*api.Task](scheme, taskValidator{}))
	server.Register("/healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	if err := server.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
