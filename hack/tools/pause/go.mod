// The dev cluster's pause image: the process that holds a pod sandbox's
// namespaces. Never imported by the main module.
module github.com/terrace-dev/terrace/hack/tools/pause

go 1.26.0
