//go:build unix

package tf

import (
	"errors"
	"syscall"
)

// noFollow makes opening a symlink fail instead of writing through it.
const noFollow = syscall.O_NOFOLLOW

func isSymlinkRefusal(err error) bool { return errors.Is(err, syscall.ELOOP) }
