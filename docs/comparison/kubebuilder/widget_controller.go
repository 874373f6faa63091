// The Widget controller in kubebuilder (Go), as `kubebuilder create api` writes it, with the
// lines a user writes between the "hand" markers (reference text for docs/controllers.md; the
// markers themselves are not counted). `make manifests` (controller-gen) writes the CRD and
// the ClusterRole from the markers.
package controller

import (
	"context"

	// hand
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	// end
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shopv1 "example.com/my-operator/api/v1"
)

// WidgetReconciler reconciles a Widget object
type WidgetReconciler struct {
	client.Client
	Scheme *runtime.Scheme
}

// +kubebuilder:rbac:groups=shop.example.com,resources=widgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=shop.example.com,resources=widgets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=shop.example.com,resources=widgets/finalizers,verbs=update
// hand
// +kubebuilder:rbac:groups=core,resources=configmaps,verbs=get;list;watch;create;update;patch
// end

func (r *WidgetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// hand
	var widget shopv1.Widget
	if err := r.Get(ctx, req.NamespacedName, &widget); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	name := widget.Name + "-widget"
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: widget.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
		cm.Data = map[string]string{"size": strconv.Itoa(int(widget.Spec.Size)), "color": widget.Spec.Color}
		return controllerutil.SetControllerReference(&widget, cm, r.Scheme)
	}); err != nil {
		return ctrl.Result{}, err
	}
	widget.Status.ConfigMap = name
	widget.Status.ObservedGeneration = widget.Generation
	if err := r.Status().Update(ctx, &widget); err != nil {
		return ctrl.Result{}, err
	}
	// end
	return ctrl.Result{}, nil
}

func (r *WidgetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		// hand
		For(&shopv1.Widget{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.ConfigMap{}).
		// end
		Named("widget").
		Complete(r)
}
