package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// claim is what a warm runner holds once a run has claimed it: the run's
// credentials, kept in memory only, which die with the pod.
type claim struct {
	mu       sync.Mutex
	leaf     *pki.Leaf
	cert     *tls.Certificate
	identity pki.Identity
}

func (c *claim) get() (*pki.Leaf, *tls.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaf, c.cert
}

// claimed says whether the runner may work: a runner started for one run
// always may, a warm one only after its claim.
func (s *Server) claimed() bool {
	if !s.cfg.Warm {
		return true
	}
	leaf, _ := s.claim.get()
	return leaf != nil
}

// clientCertificate is what the runner presents to the controller's
// servers: a warm runner the run's certificate once claimed (before that
// its class certificate, which they refuse), any other its own.
func (s *Server) clientCertificate() (*tls.Certificate, error) {
	if _, cert := s.claim.get(); cert != nil {
		return cert, nil
	}
	return s.cfg.Certificate.Certificate()
}

// backendLeaf is the leaf tofu's http backend presents to the state server.
func (s *Server) backendLeaf() (*pki.Leaf, error) {
	if s.cfg.Warm {
		leaf, _ := s.claim.get()
		if leaf == nil {
			return nil, fmt.Errorf("this warm runner has not been claimed by a run")
		}
		return leaf, nil
	}
	if s.cfg.BackendLeaf == nil {
		return nil, nil
	}
	return s.cfg.BackendLeaf()
}

// Claim implements runnerv1.RunnerServiceServer: it accepts one run's
// credentials, once, in a warm runner.
func (s *Server) Claim(_ context.Context, req *runnerv1.ClaimRequest) (*runnerv1.ClaimResponse, error) {
	if !s.cfg.Warm {
		return nil, statusError(codes.FailedPrecondition, runner.ReasonNotClaimed, "this runner was started for one run and cannot be claimed")
	}
	leaf := &pki.Leaf{CertPEM: req.GetCertificatePem(), KeyPEM: req.GetKeyPem(), CABundlePEM: req.GetCaBundlePem()}
	id, cert, err := runIdentity(leaf)
	if err != nil {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "the claim's credentials are not a run's: "+err.Error())
	}
	if err := s.sameNamespace(id); err != nil {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, err.Error())
	}
	s.claim.mu.Lock()
	defer s.claim.mu.Unlock()
	if s.claim.leaf != nil {
		return nil, statusError(codes.FailedPrecondition, runner.ReasonNotClaimed, fmt.Sprintf("this warm runner was already claimed by %s: warm runners are single-use", s.claim.identity))
	}
	s.claim.leaf, s.claim.cert, s.claim.identity = leaf, cert, id
	s.cfg.Log.Info("claimed", "identity", id.String())
	return &runnerv1.ClaimResponse{Identity: id.String()}, nil
}

// runIdentity checks that leaf is a key pair with a run's identity.
func runIdentity(leaf *pki.Leaf) (pki.Identity, *tls.Certificate, error) {
	cert, err := leaf.TLSCertificate()
	if err != nil {
		return "", nil, err
	}
	if _, err := leaf.TrustPool(); err != nil {
		return "", nil, err
	}
	id, err := pki.IdentityFromCertificate(cert.Leaf)
	if err != nil {
		return "", nil, err
	}
	if _, _, _, ok := id.Runner(); !ok {
		return "", nil, fmt.Errorf("identity %s is not a run's", id)
	}
	return id, &cert, nil
}

// sameNamespace refuses a run of another namespace than the warm runner's own.
func (s *Server) sameNamespace(run pki.Identity) error {
	own, err := s.cfg.Certificate.Certificate()
	if err != nil {
		return fmt.Errorf("failed to read the runner's own certificate: %w", err)
	}
	leaf := own.Leaf
	if leaf == nil && len(own.Certificate) > 0 {
		if leaf, err = x509.ParseCertificate(own.Certificate[0]); err != nil {
			return fmt.Errorf("failed to parse the runner's own certificate: %w", err)
		}
	}
	ownID, err := pki.IdentityFromCertificate(leaf)
	if err != nil {
		return err
	}
	ns, _, _, ok := ownID.RunnerClass()
	if !ok {
		return fmt.Errorf("this runner's identity %s is not a warm runner's", ownID)
	}
	if runNS, _, _, _ := run.Runner(); runNS != ns {
		return fmt.Errorf("run %s is not of namespace %s, where this warm runner runs", run, ns)
	}
	return nil
}
