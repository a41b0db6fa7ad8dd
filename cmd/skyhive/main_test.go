package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
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
		{"train", "--mode", "nope"},
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
		{"train", "--mode", "averaging", "--peers", "0"},
		{"train", "--mode", "averaging", "--algo", "gossip"},
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
