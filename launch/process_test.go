package launch

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Check accepts the default, never and periods within bounds, and names
// the field of a period or region out of bounds.
func TestProcessCheck(t *testing.T) {
	for _, p := range []Process{{}, {StatusEvery: -1}, {StatusEvery: Duration(time.Second), Region: "eu-west"}, {StatusEvery: Duration(time.Hour)}} {
		if err := p.Check(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	for _, c := range []struct {
		p     Process
		field string
		text  string
	}{
		{Process{StatusEvery: Duration(10 * time.Millisecond)}, "status_every", "status_every 10ms: want 0 (off) or between 1s and 1h0m0s"},
		{Process{StatusEvery: Duration(2 * time.Hour)}, "status_every", "status_every 2h0m0s"},
		{Process{Region: strings.Repeat("x", 65)}, "region", "want at most 64 bytes"},
		{Process{Region: "eu\n"}, "region", `region "eu\n"`},
	} {
		var fe *FieldError
		err := c.p.Check()
		if !errors.As(err, &fe) || len(fe.Fields) != 1 || fe.Fields[0] != c.field || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%+v: got %v, want an error on %s containing %q", c.p, err, c.field, c.text)
		}
	}
}
