package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// Protobuf returns a copy of cfg for clientsets of built-in kinds that speak
// protobuf, the format the API server encodes and decodes at the least CPU.
// controller-runtime's client already does so for built-in kinds; a
// client-go clientset defaults to JSON, and every watcher of another format
// makes the API server encode each event once more for it.
func Protobuf(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return cfg
}
