package hostile

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/launch"
)

// Options.Run refuses bad options before it attacks, naming them.
func TestOptionsCheck(t *testing.T) {
	ok := DefaultOptions()
	ok.Targets = []string{"/ip4/127.0.0.1/tcp/1/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		change func(*Options)
		fields []string
	}{
		{func(o *Options) { o.Targets = nil }, []string{"target"}},
		{func(o *Options) { o.Rate = 0 }, []string{"identities", "rate", "duration"}},
		{func(o *Options) { o.SlowRate = -1 }, []string{"slow_rate"}},
		{func(o *Options) { o.Targets = []string{"x"} }, []string{"target"}},
	}
	for i, tc := range cases {
		o := ok
		tc.change(&o)
		var fe *launch.FieldError
		if err := o.Run(context.Background(), io.Discard, io.Discard); !errors.As(err, &fe) || !slices.Equal(fe.Fields, tc.fields) {
			t.Errorf("case %d: got %v, want fields %v", i, err, tc.fields)
		}
	}
}
