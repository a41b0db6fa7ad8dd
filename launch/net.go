package launch

import (
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
)

// MinMemoryMiB is the smallest memory budget (Net.MemoryMiB) other than 0:
// below it the Go runtime and libp2p alone would exceed it.
const MinMemoryMiB = 64

// FieldError is an invalid option of a config: Text says what is wrong,
// with a %s standing for each of Fields in turn, the options at fault by
// their JSON names; Err is the cause, if any.
type FieldError struct {
	Fields []string
	Text   string
	Err    error
}

func (e *FieldError) Error() string {
	s := e.Text
	for _, f := range e.Fields {
		s = strings.Replace(s, "%s", f, 1)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// Renamed returns the error with its fields renamed by name: how a
// command names its options (flags) instead of the config's fields.
func (e *FieldError) Renamed(name func(field string) string) *FieldError {
	r := *e
	r.Fields = make([]string, len(e.Fields))
	for i, f := range e.Fields {
		r.Fields[i] = name(f)
	}
	return &r
}

// Seeds parses DHT, the swarm's DHT peers; an error is a *FieldError.
func (n Net) Seeds() ([]peer.AddrInfo, error) {
	s, err := p2p.ParseAddrInfos(n.DHT)
	if err != nil {
		return nil, NewFieldError(err, "%s", "dht")
	}
	return s, nil
}

// DHTMaxBytes bounds the records a DHT node stores: an eighth of the
// memory budget, or the DHT's default (0) without one.
func (n Net) DHTMaxBytes() int { return int(n.MemoryMiB << 20 / 8) }

// NewFieldError is a FieldError about fields: text with a %s for each, and
// its cause err (nil: none).
func NewFieldError(err error, text string, fields ...string) *FieldError {
	return &FieldError{Fields: fields, Text: text, Err: err}
}
