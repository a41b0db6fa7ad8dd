package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/train"
)

// TestEveryCommandHasHelp walks the whole command tree: every command must
// print usage with --help and have a short description.
func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if c.Short == "" && c.HasParent() {
			t.Errorf("%q has no short description", c.CommandPath())
		}
		path := strings.Fields(c.CommandPath())[1:]
		var out syncBuffer
		if err := runCLI(context.Background(), &out, append(path, "--help")...); err != nil {
			t.Errorf("%q --help: %v", c.CommandPath(), err)
		}
		if !strings.Contains(out.String(), "Usage:") {
			t.Errorf("%q --help printed no usage:\n%s", c.CommandPath(), out.String())
		}
		n++
		for _, sub := range c.Commands() {
			if !sub.Hidden && sub.Name() != "help" && sub.Name() != "completion" {
				walk(sub)
			}
		}
	}
	walk(newRootCmd())
	if n < 6 {
		t.Fatalf("only %d commands found", n)
	}
}

func TestBadInputIsAClearError(t *testing.T) {
	cases := [][]string{
		{"bench", "no-such-suite"},
		{"bench", "gemm", "--reps", "2"},
		{"train", "nope"},
		{"train", "pipeline"},
		{"train", "pipeline", "--workers", "2", "--regions", "../../examples/regions.json", "--latency", "10ms"},
		{"train", "moe"},
		{"train", "moe", "--dht", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd", "--latency", "-1s"},
		{"demo", "moe", "--servers", "0"},
		{"dht", "get", "k"},
		{"train", "--data", "cifar"},
		{"train", "--epochs", "0"},
		{"train", "--data-dir", "/nonexistent", "--epochs", "1"},
		{"experiment", "no-such-experiment"},
		{"experiment", "moe-convergence", "--only", "no-such-run"},
		{"experiment", "averaging-convergence", "--only", "no-such-run", "--quick"},
		{"--cpuprofile", "/nonexistent/dir/cpu.prof", "experiment", "moe-convergence"},
		{"--gemm", "blas", "plan"},
		{"peer"},
		{"peer", "--dht", "not-a-multiaddr"},
		{"peer", "--dht", "/ip4/127.0.0.1/tcp/4001"},
		{"peer", "--dht", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd", "--algo", "sgd"},
		{"peer", "--dht", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd", "--shard", "3/2"},
		{"peer", "--dht", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd", "--matchmaking", "dht", "--algo", "local"},
		{"train", "averaging", "--peers", "0"},
		{"train", "averaging", "--algo", "gossip"},
		{"train", "averaging", "--slowdown-min", "3", "--slowdown-max", "2"},
	}
	for _, args := range cases {
		var out syncBuffer
		err := runCLI(context.Background(), &out, args...)
		if err == nil {
			t.Errorf("%v: no error", args)
			continue
		}
		if len(err.Error()) < 10 {
			t.Errorf("%v: unhelpful error %q", args, err)
		}
	}
	var out syncBuffer
	err := runCLI(context.Background(), &out, "train", "--data-dir", "/nonexistent", "--epochs", "1")
	if err == nil || !strings.Contains(err.Error(), "apt-get install dataset-fashion-mnist") {
		t.Errorf("missing data set error does not say how to install it: %v", err)
	}
}

// --cpuprofile writes a (gzipped protobuf) profile of a successful command.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	var out syncBuffer
	err := runCLI(context.Background(), &out, "--cpuprofile", path, "plan",
		"--cluster", "../../examples/cluster-hetero.json", "--model", "bert-large:24", "--strategy", "even")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("%s is not a gzipped profile (%d bytes)", path, len(b))
	}
}

func TestLegacyTrainArgs(t *testing.T) {
	cases := []struct{ in, want string }{
		{"train --mode pipeline --workers 4", "train pipeline --workers 4"},
		{"--gemm go train --epochs 1 --mode=moe --dht X", "--gemm go train moe --epochs 1 --dht X"},
		{"train --model mlp", "train --model mlp"},
		{"peer --run-id train --mode x", "peer --run-id train --mode x"},
		{"train averaging --peers 2", "train averaging --peers 2"},
	}
	for _, c := range cases {
		var warn strings.Builder
		got := strings.Join(legacyTrainArgs(strings.Fields(c.in), &warn), " ")
		if got != c.want {
			t.Errorf("%q: got %q, want %q", c.in, got, c.want)
		}
		if (got != c.in) != (warn.Len() > 0) {
			t.Errorf("%q: warning %q", c.in, warn.String())
		}
	}
}

// Renamed flags keep working under their old names.
func TestRenamedFlags(t *testing.T) {
	cmd := newTrainAveragingCmd()
	if err := cmd.ParseFlags([]string{"--avg-lr", "0.2", "--avg-slowdown-max", "3"}); err != nil {
		t.Fatal(err)
	}
	if v, _ := cmd.Flags().GetFloat64("lr"); v != 0.2 {
		t.Errorf("--avg-lr set --lr to %v", v)
	}
	if v, _ := cmd.Flags().GetFloat64("slowdown-max"); v != 3 {
		t.Errorf("--avg-slowdown-max set --slowdown-max to %v", v)
	}
	m := newTrainMoECmd()
	if err := m.ParseFlags([]string{"--moe-grids", "a.2.2", "--emulated-rtt", "40ms"}); err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Flags().GetString("grids"); v != "a.2.2" {
		t.Errorf("--moe-grids set --grids to %q", v)
	}
	if v, _ := m.Flags().GetDuration("rtt"); v != 40*time.Millisecond {
		t.Errorf("--emulated-rtt set --rtt to %v", v)
	}
}

// train local: --json prints the result on stdout and --stats appends a
// line per epoch.
func TestTrainLocalJSONAndStats(t *testing.T) {
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skip("Fashion-MNIST not installed")
	}
	stats := filepath.Join(t.TempDir(), "train.jsonl")
	root := newRootCmd()
	var stdout, stderr syncBuffer
	root.SetArgs([]string{"train", "local", "--model", "mlp-small", "--epochs", "2", "--limit", "512", "--batch", "64",
		"--json", "--stats", stats})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var res train.Result
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout.String())
	}
	if len(res.Epochs) != 2 || res.TestAccuracy <= 0.1 {
		t.Fatalf("result %+v", res)
	}
	b, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d stats lines, want 2:\n%s", len(lines), b)
	}
	var e train.EpochStats
	if err := json.Unmarshal([]byte(lines[1]), &e); err != nil || e.Epoch != 2 {
		t.Fatalf("second line %q: %+v, %v", lines[1], e, err)
	}
}

// A port in use is an error that says what to do; it ends the command.
func TestPortInUseSaysWhatToDo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	var out syncBuffer
	err = runCLI(context.Background(), &out, "dht", "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port))
	if err == nil || !strings.Contains(withHint(err).Error(), "choose another port") {
		t.Fatalf("got %v", err)
	}
}
