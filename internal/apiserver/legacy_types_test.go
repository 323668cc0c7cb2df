package apiserver

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// The JSON shapes of the REST API as its clients decode them, written with
// encoding/json as they were before the service was transcoded: the REST
// tests decode into these, so a field that changed name or type fails them.

type Source struct {
	ProgramRef string `json:"programRef,omitempty"`
	URL        string `json:"url,omitempty"`
	Digest     string `json:"digest,omitempty"`
	SourceRef  string `json:"sourceRef,omitempty"`
}

type Installation struct {
	Name        string             `json:"name"`
	Namespace   string             `json:"namespace"`
	Source      Source             `json:"source"`
	Path        string             `json:"path,omitempty"`
	ApprovePlan string             `json:"approvePlan,omitempty"`
	Ready       bool               `json:"ready"`
	Status      string             `json:"status,omitempty"`
	Message     string             `json:"message,omitempty"`
	PendingPlan string             `json:"pendingPlan,omitempty"`
	Revision    string             `json:"revision,omitempty"`
	Release     int64              `json:"release,omitempty"`
	Outputs     []string           `json:"outputs,omitempty"`
	Conditions  []metav1.Condition `json:"conditions,omitempty"`
	CreatedAt   time.Time          `json:"createdAt"`
	Deleting    bool               `json:"deleting,omitempty"`
}

type InstallationList struct {
	Items []Installation `json:"items"`
}

type Plan struct {
	ID             string       `json:"id"`
	Approvable     bool         `json:"approvable"`
	Add            int32        `json:"add"`
	Change         int32        `json:"change"`
	Destroy        int32        `json:"destroy"`
	Drift          int32        `json:"drift,omitempty"`
	DestroyPlan    bool         `json:"destroyPlan,omitempty"`
	CreatedAt      *metav1.Time `json:"createdAt,omitempty"`
	Revision       string       `json:"revision,omitempty"`
	ReadableFormat string       `json:"readableFormat,omitempty"`
	Readable       string       `json:"readable,omitempty"`
	Note           string       `json:"note,omitempty"`
	Policy         *struct {
		Decision       string   `json:"decision"`
		Warnings       []string `json:"warnings"`
		PoliciesDigest string   `json:"policiesDigest"`
	} `json:"policy,omitempty"`
}

type ReleaseList struct {
	Items []release.Release `json:"items"`
}

type Outputs struct {
	Items []stackview.Output `json:"items"`
	Note  string             `json:"note,omitempty"`
}

type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
}
