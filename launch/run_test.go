package launch

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// RunFile runs the runner of the file's role with the file's fields over
// the defaults, after preparing its process options; it refuses a role
// without a runner, naming the ones it has.
func TestRunFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dht.json")
	if err := Write(path, &DHT{Process: Process{GEMM: "go"}, StatsEvery: Duration(7)}); err != nil {
		t.Fatal(err)
	}
	var prepared Process
	var got DHT
	runners := map[string]Runner{RoleDHT: FileRunner(func() DHT { return DHT{Output: Output{Stats: "s.jsonl"}} },
		func(p Process) error { prepared = p; return nil },
		func(_ context.Context, _, _ io.Writer, c DHT) error { got = c; return nil })}
	if err := RunFile(context.Background(), path, io.Discard, io.Discard, runners); err != nil {
		t.Fatal(err)
	}
	if got.StatsEvery != 7 || got.Stats != "s.jsonl" || prepared.GEMM != "go" {
		t.Errorf("ran %+v, prepared %+v", got, prepared)
	}
	bad := errors.New("no such backend")
	runners[RoleDHT] = FileRunner(func() DHT { return DHT{} }, func(Process) error { return bad },
		func(context.Context, io.Writer, io.Writer, DHT) error {
			t.Error("ran despite a failed preparation")
			return nil
		})
	if err := RunFile(context.Background(), path, io.Discard, io.Discard, runners); !errors.Is(err, bad) {
		t.Errorf("failed preparation: %v", err)
	}
	err := RunFile(context.Background(), path, io.Discard, io.Discard, map[string]Runner{RolePeer: nil})
	if err == nil || !strings.Contains(err.Error(), `unknown role "dht" (want peer)`) {
		t.Errorf("role without a runner: %v", err)
	}
}
