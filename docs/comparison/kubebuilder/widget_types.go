// The Widget API in kubebuilder (Go), as `kubebuilder create api --group shop --version v1
// --kind Widget` writes it, with the fields a user adds between the "hand" markers (reference
// text for docs/controllers.md; the markers themselves are not counted).
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WidgetSpec defines the desired state of Widget
// hand
// +kubebuilder:validation:XValidation:rule="self.size <= 10 || self.color == 'blue'",message="big widgets are blue"
// end
type WidgetSpec struct {
	// hand
	// How big, 1 to 100.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Size int32 `json:"size"`
	// red (the default) or blue.
	// +kubebuilder:validation:Enum=red;blue
	// +kubebuilder:default=red
	// +optional
	Color string `json:"color,omitempty"`
	// end
}

// WidgetStatus defines the observed state of Widget.
type WidgetStatus struct {
	// hand
	// The ConfigMap that holds the widget.
	// +optional
	ConfigMap string `json:"configMap,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// end
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// Widget is the Schema for the widgets API
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WidgetSpec   `json:"spec"`
	Status WidgetStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WidgetList contains a list of Widget
type WidgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Widget `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Widget{}, &WidgetList{})
}
