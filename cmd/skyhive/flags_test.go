package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestNumericFlagsCheckedFirst checks that nonsense numbers are refused
// when the command starts, naming the flag and the value, before it loads
// data or joins a network (each case fails within a second).
func TestNumericFlagsCheckedFirst(t *testing.T) {
	dht := "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"train", "moe", "--dht", dht, "--steps", "-50"}, "--steps -50: must not be negative"},
		{[]string{"train", "pipeline", "--steps", "-50"}, "--steps -50: must not be negative"},
		{[]string{"train", "pipeline", "--batch", "0"}, "--batch 0: must be above 0"},
		{[]string{"train", "--lr", "NaN"}, "--lr NaN: must be a finite number"},
		{[]string{"train", "--lr", "-0.1"}, "--lr -0.1: must be above 0"},
		{[]string{"demo", "moe", "--forward-timeout", "-1s"}, "--forward-timeout -1s: must not be negative"},
		{[]string{"server", "--checkpoint-every", "-5m"}, "--checkpoint-every -5m0s: must not be negative"},
		{[]string{"server", "--hidden", "0"}, "--hidden 0: must be above 0"},
		{[]string{"train", "moe", "--dht", dht, "--max-failed-steps", "2"}, "--max-failed-steps 2: a fraction"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		var out syncBuffer
		err := runCLI(ctx, &out, c.args...)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error with %q", c.args, err, c.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%v: refused after %v, want at once", c.args, d)
		}
	}
	// A negative value that means something is accepted by the check.
	if err := checkNumbers(newServerCmd().Flags(), numberRules{Negative: []string{"clip"}}); err != nil {
		t.Fatal(err)
	}
	fl := newServerCmd().Flags()
	if err := fl.Parse([]string{"--clip", "-1"}); err != nil {
		t.Fatal(err)
	}
	if err := checkNumbers(fl, numberRules{Negative: []string{"clip"}}); err != nil {
		t.Fatalf("--clip -1 (disables clipping): %v", err)
	}
}
