package httpbackend

// The bounds the state server serves under: admission by size, body deadlines, connection caps.

import (
	"time"
)

// retryAfterSeconds is the Retry-After of a 503 for a busy server.
const retryAfterSeconds = "5"

// A body admitted must move at least this fast, after the body timeout,
// so a client that trickles its bytes cannot hold a budget for long.
const minTransferBytesPerSecond = 1 << 20

// DefaultBodyTimeout is Options.BodyTimeout's default.
const DefaultBodyTimeout = 15 * time.Second

const maxLockBodyBytes = 1 << 20

// retryAfterConnections is the Retry-After of a 429 for too many connections.
const retryAfterConnections = "2"

// handlerLimits are the bounds a Handler serves under (NewServer's options).
type handlerLimits struct {
	// large admits states over 1 MiB (and bodies of unknown length) whole,
	// before they are read or sent; small admits smaller ones as their
	// bytes arrive, and smaller states before they are sent.
	large, small *admission
	bodyTimeout  time.Duration
	// conns caps connections per identity and namespace; nil caps none.
	conns *connectionLimits
}

func newHandlerLimits(opts Options) *handlerLimits {
	return &handlerLimits{
		large:       newAdmission("large states", inflightBytes, opts.MaxInflightBytes, opts.MaxInflightBytesPerNamespace, opts.AdmissionWait),
		small:       newAdmission("small states and lock infos", inflightSmallBytes, opts.MaxSmallInflightBytes, opts.MaxSmallInflightBytesPerNamespace, opts.AdmissionWait),
		bodyTimeout: opts.BodyTimeout,
	}
}

// admissionFor is the budget a transfer of size bytes is admitted from.
func (l *handlerLimits) admissionFor(size int64) *admission {
	if size > smallBodyBytes {
		return l.large
	}
	return l.small
}

// transferTime is how long a transfer of size bytes may take.
func (l *handlerLimits) transferTime(size int64) time.Duration {
	return l.bodyTimeout + time.Duration(size/minTransferBytesPerSecond)*time.Second
}

// transferDeadline is when a transfer of size bytes must be done.
func (l *handlerLimits) transferDeadline(size int64) time.Time {
	return time.Now().Add(l.transferTime(size))
}
