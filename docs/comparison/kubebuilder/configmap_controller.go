// The mirror controller in kubebuilder (Go): ConfigMaps labelled app=demo mirrored into Secrets
// they own. `kubebuilder create api --group core --version v1 --kind ConfigMap --resource=false
// --controller=true` writes this file's skeleton and its wiring in cmd/main.go; the lines
// between the "hand" markers are what a user writes (reference text for docs/controllers.md;
// the markers themselves are not counted).
package controller

import (
	"context"

	// hand
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	// end
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// ConfigMapReconciler reconciles a ConfigMap object
type ConfigMapReconciler struct {
	client.Client
	Scheme *runtime.Scheme
}

// +kubebuilder:rbac:groups=core,resources=configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=core,resources=configmaps/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=core,resources=configmaps/finalizers,verbs=update
// hand
// +kubebuilder:rbac:groups=core,resources=secrets,verbs=get;list;watch;create;update;patch
// end

func (r *ConfigMapReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	// hand
	var cm corev1.ConfigMap
	if err := r.Get(ctx, req.NamespacedName, &cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cm.Name, Namespace: cm.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, secret, func() error {
		secret.Data = map[string][]byte{}
		for k, v := range cm.Data {
			secret.Data[k] = []byte(v)
		}
		return controllerutil.SetControllerReference(&cm, secret, r.Scheme)
	}); err != nil {
		return ctrl.Result{}, err
	}
	log.Info("mirrored", "keys", len(secret.Data))
	// end
	return ctrl.Result{}, nil
}

func (r *ConfigMapReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		// hand
		Owns(&corev1.Secret{}).
		// end
		Named("configmap-mirror").
		Complete(r)
}

