// The mirror controller in kubebuilder (Go), the rest: what a user adds to the cmd/main.go
// that `kubebuilder init` writes, so that the manager caches (and so reconciles) only the
// ConfigMaps labelled app=demo. Only the lines between the "hand" markers are counted.
package main

import (
	// hand
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	// end
	ctrl "sigs.k8s.io/controller-runtime"
)

func newManager(options ctrl.Options) (ctrl.Manager, error) {
	// hand
	options.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{"app": "demo"})},
	}}
	// end
	return ctrl.NewManager(ctrl.GetConfigOrDie(), options)
}
