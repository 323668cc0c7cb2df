package tf

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Saved plan files move between runners: the planning runner hands its
// plan to the controller, and the runner applying it hours later receives
// it back, checked against its digest.

// PlanFile is an open saved plan for download.
type PlanFile struct {
	io.ReadCloser
	Digest string
	Size   int64
}

// OpenPlanFile opens the saved plan planID.
func (e *Executor) OpenPlanFile(planID string) (*PlanFile, error) {
	path, err := e.existingPlanPath(planID)
	if err != nil {
		return nil, err
	}
	digest, err := fileDigest(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("failed to open plan %s: %w", planID, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("failed to stat plan %s: %w", planID, err)
	}
	return &PlanFile{ReadCloser: f, Digest: digest, Size: fi.Size()}, nil
}

// StorePlanFile saves a plan file received from the controller under
// planID, after checking it against digest ("sha256:<hex>"); at most
// maxBytes are read.
func (e *Executor) StorePlanFile(planID, digest string, r io.Reader, maxBytes int64) error {
	path, err := e.planPath(planID)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(digest, "sha256:") || len(digest) != len("sha256:")+64 {
		return fmt.Errorf("%w: plan digest %q must be sha256:<64 hex digits>", ErrInvalidArgument, digest)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "upload-*.tfplan")
	if err != nil {
		return fmt.Errorf("failed to create the plan file: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxBytes+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("failed to receive the plan file: %w", err)
	}
	if n > maxBytes {
		return fmt.Errorf("%w: the plan file is larger than %d bytes", ErrInvalidArgument, maxBytes)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("%w: plan file digest is %s, expected %s", ErrInvalidArgument, got, digest)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("failed to store the plan file: %w", err)
	}
	return nil
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("failed to open %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("failed to hash %s: %w", filepath.Base(path), err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
