package devnode

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/terrace-dev/terrace/internal/runnerbin"
)

// DefaultImages are the image repositories devnode runs with the local
// terrace binary: "terrace" itself and any repository ending in "/terrace",
// such as ghcr.io/terrace-dev/terrace.
var DefaultImages = []string{"terrace", "*/terrace"}

// Reasons devnode reports when it cannot run a pod.
const (
	// ReasonUnsupportedImage: the image is not one devnode maps to the terrace binary.
	ReasonUnsupportedImage = "UnsupportedImage"
	// ReasonUnsupportedCommand: the command is not the terrace binary.
	ReasonUnsupportedCommand = "UnsupportedCommand"
	// ReasonUnsupportedVolume: a volume type devnode cannot materialise.
	ReasonUnsupportedVolume = "UnsupportedVolume"
)

// imageRepository strips the digest and the tag from an image reference.
func imageRepository(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	// A colon after the last slash starts the tag; one before it is a registry port.
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// imageMatches reports whether image's repository is one of patterns. A
// pattern is a repository, or "*/name" for any repository ending in "/name".
func imageMatches(image string, patterns []string) bool {
	repo := imageRepository(image)
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*"); ok {
			if strings.HasSuffix(repo, suffix) {
				return true
			}
			continue
		}
		if repo == p {
			return true
		}
	}
	return false
}

// unsupportedError is a reason a pod can never run on devnode.
type unsupportedError struct {
	reason  string
	message string
}

func (e *unsupportedError) Error() string { return e.message }

// binaryArgs returns the arguments to pass to the terrace binary for c: the
// image entrypoint (no command) and a command naming terrace both mean the
// binary.
func binaryArgs(c *corev1.Container, images []string) ([]string, error) {
	if !imageMatches(c.Image, images) {
		return nil, &unsupportedError{reason: ReasonUnsupportedImage, message: fmt.Sprintf(
			"container %q: devnode runs only the terrace image (repositories %s) with the local terrace binary; image %q cannot run here",
			c.Name, strings.Join(images, ", "), c.Image)}
	}
	if len(c.Command) == 0 {
		return append([]string(nil), c.Args...), nil
	}
	var out []string
	switch {
	case isTerraceCommand(c.Command[0]):
	case path.Base(c.Command[0]) == runnerbin.Name:
		// The lean runner binary is `terrace runner`.
		out = []string{"runner"}
	default:
		return nil, &unsupportedError{reason: ReasonUnsupportedCommand, message: fmt.Sprintf(
			"container %q: devnode runs only the terrace binary; command %q is not terrace", c.Name, c.Command[0])}
	}
	out = append(out, c.Command[1:]...)
	return append(out, c.Args...), nil
}

// isTerraceCommand reports whether cmd names the terrace binary (an exec
// probe may run it too).
func isTerraceCommand(cmd string) bool {
	base := path.Base(cmd)
	return base == "terrace" || base == "kubectl-terrace"
}
