package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
)

type digester struct{ h hash.Hash }

func newDigester() *digester { return &digester{h: sha256.New()} }

func (d *digester) Write(p []byte) { d.h.Write(p) }

func (d *digester) digest() string { return "sha256:" + hex.EncodeToString(d.h.Sum(nil)) }
