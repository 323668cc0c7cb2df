// Package runnerbin names the lean runner binary for the packages that
// build it into the image, start it in runner pods or stand in for it
// (internal/image, internal/launcher), without their
// linking the runner itself.
package runnerbin

const (
	// Name is the binary's name, and the name under which the terrace
	// binary behaves as it (cmd/terrace).
	Name = "terrace-runner"
	// ImagePath is where Terrace's image holds it: the command of every
	// runner pod.
	ImagePath = "/usr/local/bin/" + Name
)
