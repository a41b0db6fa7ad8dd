package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/text"
)

// train averaging --model gpt-mini starts two `skyhive peer` processes
// that train GPT replicas with all-reduce SGD on the same English text (64
// KB of GCIDE, or where it is not installed a small text file); --json
// reports each peer's validation perplexity, finite and below the
// unigram's on the same tokens, and the replicas agree.
func TestTrainAveragingLanguageModel(t *testing.T) {
	data := "gcide"
	if _, err := os.Stat(text.DefaultGCIDEPath); err != nil {
		data = "text:" + writeText(t)
	}
	res := trainAveragingLM(t, data, 60, "--algo", "allreduce")
	for i, r := range res.Peers {
		if r.Steps != 60 || r.Model != fmt.Sprintf("gpt-mini:%dx16", r.Vocab) || r.Vocab < 257 || r.Vocab > 300 || r.Algo != "allreduce" || r.EvalTokens == 0 || r.Failures != 0 {
			t.Fatalf("peer %d: %+v", i, r)
		}
		if math.IsNaN(r.ValPerplexity) || math.IsInf(r.ValPerplexity, 0) || !(r.ValPerplexity > 1) || !(r.ValPerplexity < r.UnigramPerplexity) ||
			math.Abs(math.Log(r.ValPerplexity)-r.ValLoss) > 1e-9 {
			t.Fatalf("peer %d: validation perplexity %v (loss %v), unigram %v", i, r.ValPerplexity, r.ValLoss, r.UnigramPerplexity)
		}
		t.Logf("peer %d: validation perplexity %.2f, unigram %.2f, %d steps, %d rounds, %.1fs", i, r.ValPerplexity, r.UnigramPerplexity, r.Steps, r.Rounds, r.Seconds)
	}
	// All-reduce SGD keeps the replicas equal: the same model evaluated
	// on the same tokens.
	if a, b := res.Peers[0].ValLoss, res.Peers[1].ValLoss; math.Abs(a-b) > 1e-3*a {
		t.Errorf("the replicas' validation losses differ: %v and %v", a, b)
	}
	if m := (res.Peers[0].ValPerplexity + res.Peers[1].ValPerplexity) / 2; math.Abs(res.MeanValPerplexity-m) > 1e-9*m {
		t.Errorf("mean validation perplexity %v, want %v", res.MeanValPerplexity, m)
	}
}

// Language-model flags given to an image model, image flags given to a
// language model, and data of the wrong kind are clear errors naming the
// flag, before any peer starts.
func TestAveragingLanguageModelBadFlags(t *testing.T) {
	const dht = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"train", "averaging", "--vocab", "300"}, "--vocab is for language models"},
		{[]string{"train", "averaging", "--data", "gcide"}, "mlp-small is an image classifier and gcide is text"},
		{[]string{"train", "averaging", "--model", "gpt-mini", "--data", "fashion-mnist"}, "gpt-mini is a language model"},
		{[]string{"train", "averaging", "--model", "gpt-mini", "--limit", "100"}, "--limit is for image models"},
		{[]string{"train", "averaging", "--model", "gpt-mini", "--data", "tokens:/tmp/x.bin"}, "--vocab"},
		{[]string{"train", "averaging", "--model", "gpt-mini", "--duration", "0"}, "--duration or a number of --steps"},
		{[]string{"peer", "--dht", dht, "--model", "gpt-mini", "--momentum", "0.5"}, "--momentum is for image models"},
		{[]string{"peer", "--dht", dht, "--seq", "32"}, "--seq is for language models"},
		{[]string{"peer", "--dht", dht, "--model", "gpt-mini", "--data", "images"}, "unknown data"},
		{[]string{"peer", "--dht", dht, "--model", "gpt-mini", "--data", "text:/nonexistent/corpus.txt"}, "/nonexistent/corpus.txt"},
		{[]string{"peer", "--dht", dht, "--algo", "diloco", "--inner-steps", "100", "--warmup-inner-steps", "500"}, "--warmup-inner-steps must be 0 (no warm-up) to --inner-steps (100)"},
		{[]string{"train", "averaging", "--algo", "wa-diloco", "--warmup-inner-steps", "-1"}, "--warmup-inner-steps must be 0"},
		{[]string{"train", "averaging", "--algo", "diloco", "--inner-steps", "0"}, "--inner-steps must be at least 1"},
		{[]string{"train", "averaging", "--algo", "wa-diloco", "--fragments", "2"}, "--fragments and --overlap-steps are for --algo diloco"},
		{[]string{"peer", "--dht", dht, "--algo", "diloco", "--overlap-steps", "1", "--warmup-inner-steps", "5"}, "without --warmup-inner-steps"},
		{[]string{"train", "averaging", "--algo", "diloco", "--inner-steps", "10", "--overlap-steps", "10"}, "--overlap-steps 0 to 9"},
		{[]string{"peer", "--dht", dht, "--algo", "diloco", "--inner-steps", "4", "--fragments", "5"}, "--fragments must be 0 to --inner-steps (4)"},
	}
	for _, c := range cases {
		var out syncBuffer
		err := runCLI(context.Background(), &out, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one mentioning %q", c.args, err, c.want)
		}
	}
}

// DiLoCo from the command line: two peer processes take 10 AdamW steps
// alone between outer steps on their averaged pseudo-gradients; after the
// last outer step both hold the same model, and it beats the unigram.
// 200 steps: the peers' batch orders depend on their random IDs, and after
// 60 steps the outer model's perplexity ranged from 51 to 68 over 8 runs
// against the unigram's 69.3 (Streaming DiLoCo's, below, 54 to 71; after
// 200 steps 30–42 and 29–58).
func TestTrainAveragingDiLoCo(t *testing.T) {
	data := "gcide"
	if _, err := os.Stat(text.DefaultGCIDEPath); err != nil {
		data = "text:" + writeText(t)
	}
	res := trainAveragingLM(t, data, 200, "--algo", "diloco", "--inner-steps", "10", "--outer-lr", "0.7", "--outer-momentum", "0.5")
	for i, r := range res.Peers {
		if r.Steps != 200 || r.Algo != "diloco" || r.Failures != 0 || r.Rounds != 20 {
			t.Fatalf("peer %d: %+v", i, r)
		}
		if !(r.ValPerplexity > 1) || !(r.ValPerplexity < r.UnigramPerplexity) {
			t.Fatalf("peer %d: validation perplexity %v, unigram %v", i, r.ValPerplexity, r.UnigramPerplexity)
		}
		t.Logf("peer %d: validation perplexity %.2f, unigram %.2f, %d steps, %d outer steps, %d bytes sent, %.1fs", i, r.ValPerplexity, r.UnigramPerplexity, r.Steps, r.Rounds, r.BytesSent, r.Seconds)
	}
	if a, b := res.Peers[0].ValLoss, res.Peers[1].ValLoss; math.Abs(a-b) > 1e-3*a {
		t.Errorf("the replicas' validation losses differ after the last outer step: %v and %v", a, b)
	}
}

// Streaming DiLoCo from the command line: two peer processes, the model
// in 2 fragments that take their outer steps in turn every 5 of the 10
// inner steps, each all-reduce running behind 2 inner steps. Both peers
// evaluate the same outer model, and it beats the unigram.
func TestTrainAveragingStreamingDiLoCo(t *testing.T) {
	data := "gcide"
	if _, err := os.Stat(text.DefaultGCIDEPath); err != nil {
		data = "text:" + writeText(t)
	}
	res := trainAveragingLM(t, data, 200, "--algo", "diloco", "--inner-steps", "10", "--fragments", "2", "--overlap-steps", "2", "--outer-lr", "0.7", "--outer-momentum", "0.5")
	for i, r := range res.Peers {
		if r.Steps != 200 || r.Algo != "diloco" || r.Failures != 0 || r.Rounds != 20 {
			t.Fatalf("peer %d: %+v", i, r)
		}
		if !(r.ValPerplexity > 1) || !(r.ValPerplexity < r.UnigramPerplexity) {
			t.Fatalf("peer %d: validation perplexity %v, unigram %v", i, r.ValPerplexity, r.UnigramPerplexity)
		}
		t.Logf("peer %d: validation perplexity %.2f, unigram %.2f, %d bytes sent, %.1fs", i, r.ValPerplexity, r.UnigramPerplexity, r.BytesSent, r.Seconds)
	}
	if a, b := res.Peers[0].ValLoss, res.Peers[1].ValLoss; math.Abs(a-b) > 1e-3*a {
		t.Errorf("the peers' outer models differ: validation losses %v and %v", a, b)
	}
}

// trainAveragingLM runs `skyhive train averaging` with two peers training
// gpt-mini for steps steps on data, with the extra arguments, and returns its
// JSON result.
func trainAveragingLM(t *testing.T, data string, steps int, args ...string) peer.Launched {
	t.Helper()
	var stdout syncBuffer
	p := startCLI(t, &stdout, append([]string{"train", "averaging", "--model", "gpt-mini", "--data", data, "--corpus-bytes", "65536",
		"--vocab", "300", "--seq", "16", "--batch", "8", "--eval-tokens", "2000", "--warmup", "5",
		"--peers", "2", "--steps", strconv.Itoa(steps), "--slowdown-max", "1", "--logs", t.TempDir(), "--json"}, args...)...)
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, tail(p.stderr.String()))
	}
	var res peer.Launched
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout.String())
	}
	if len(res.Peers) != 2 {
		t.Fatalf("%d peer results: %+v\nstderr:\n%s", len(res.Peers), res, tail(p.stderr.String()))
	}
	return res
}

// train averaging says what it started and how far the peers got while
// they train (every 5 s, and at their end), on stderr, before it prints
// their results. The peers train for 7 s, so one progress line comes
// before the end.
func TestTrainAveragingShowsProgress(t *testing.T) {
	t.Setenv(envAsCLI, "1")
	var out syncBuffer
	err := runCLI(context.Background(), &out, "train", "averaging", "--model", "gpt-mini", "--data", "text:"+writeText(t),
		"--corpus-bytes", "65536", "--vocab", "300", "--seq", "16", "--batch", "8", "--eval-tokens", "2000",
		"--peers", "2", "--steps", "100000", "--duration", "7s", "--logs", t.TempDir())
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	started := strings.Index(s, "started 2 peer processes, slowdowns ")
	done := strings.Index(s, "peer processes done after ")
	result := strings.Index(s, "mean validation perplexity of 2 peers")
	if started < 0 || done < started || result < done {
		t.Fatalf("want the start, the end and then the results in order; got:\n%s", s)
	}
	if !regexp.MustCompile(`\n +\d+s: peer0 .*; peer1 `).MatchString(s[started:done]) {
		t.Errorf("no progress line while the peers train:\n%s", s)
	}
	if !regexp.MustCompile(`done after \d+s: peer0 \d+ steps, \d+ groups, perplexity [0-9.]+, done; peer1 \d+ steps`).MatchString(s[done:result]) {
		t.Errorf("the end does not show the peers' steps and perplexity:\n%s", s)
	}
}
