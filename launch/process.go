package launch

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/skyhive/skyhive/metrics"
)

// Bounds of a role's process options: its status record is published at
// most once a second, and its region is at most MaxRegionBytes of printable
// text.
const (
	MinStatusEvery = time.Second
	MaxRegionBytes = 64
)

// ProcessOptions returns p: the process options of every config that
// embeds Process, for code that handles the roles' configs alike.
func (p Process) ProcessOptions() Process { return p }

// Check validates the options: StatusEvery left out (the default),
// negative (never) or between MinStatusEvery and metrics.MaxStatusPeriod,
// and Region. Errors are *FieldError.
func (p Process) Check() error {
	every := time.Duration(p.StatusEvery)
	switch {
	case every > 0 && (every < MinStatusEvery || every > metrics.MaxStatusPeriod):
		return NewFieldError(nil, fmt.Sprintf("%%s %v: want 0 (off) or between %v and %v", every, MinStatusEvery, metrics.MaxStatusPeriod), "status_every")
	case len(p.Region) > MaxRegionBytes || !utf8.ValidString(p.Region) || strings.ContainsFunc(p.Region, func(r rune) bool { return !unicode.IsPrint(r) }):
		return NewFieldError(nil, fmt.Sprintf("%%s %q: want at most %d bytes of printable text", p.Region, MaxRegionBytes), "region")
	}
	return nil
}
