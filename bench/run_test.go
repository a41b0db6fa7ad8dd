package bench

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/launch"
)

// Select finds a suite by name, or all of All's, and an unknown name's
// error lists every suite; Run refuses fewer than 5 repetitions, naming
// the option.
func TestSelectAndRunChecks(t *testing.T) {
	all, err := Select("all")
	if err != nil || len(all) != len(All()) {
		t.Fatalf("all: %d suites, %v", len(all), err)
	}
	if s, err := Select("rpc"); err != nil || len(s) != 1 || s[0].Name != "rpc" {
		t.Fatalf("rpc: %v, %v", s, err)
	}
	_, err = Select("nope")
	if err == nil || !strings.Contains(err.Error(), `unknown suite "nope"`) || !strings.Contains(err.Error(), "  soak") {
		t.Fatalf("nope: %v", err)
	}
	var fe *launch.FieldError
	if err := Run(context.Background(), all, Options{Reps: 4}, "", io.Discard, false); !errors.As(err, &fe) || fe.Fields[0] != "reps" {
		t.Fatalf("4 reps: %v", err)
	}
}
