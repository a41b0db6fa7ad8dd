package dashboard

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// Run refuses bad options before it joins the DHT, naming them.
func TestRunRefusesOptions(t *testing.T) {
	seed := []string{"/ip4/127.0.0.1/tcp/1/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"}
	cases := []struct {
		c     RunConfig
		field string
	}{
		{RunConfig{Every: time.Second}, "dht"},
		{RunConfig{DHT: seed, Every: time.Millisecond}, "every"},
		{RunConfig{DHT: seed, Every: time.Second, Listen: "no-port"}, "listen"},
	}
	for _, tc := range cases {
		var fe *launch.FieldError
		if err := Run(context.Background(), tc.c, io.Discard); !errors.As(err, &fe) || !slices.Equal(fe.Fields, []string{tc.field}) {
			t.Errorf("%+v: got %v, want an error about %s", tc.c, err, tc.field)
		}
	}
}
