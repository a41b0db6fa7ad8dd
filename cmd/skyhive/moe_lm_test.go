package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/moe/trainer"
	"github.com/skyhive/skyhive/text"
)

// runMoELM runs `skyhive demo moe` on a language-model corpus with a tiny
// DMoE transformer and returns its JSON result and its stderr.
func runMoELM(t *testing.T, data string, extra ...string) (trainer.Result, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"demo", "moe", "--data", data, "--vocab", "300", "--seq", "16", "--hidden", "32", "--heads", "2",
		"--grids", "l0.2.2,l1.2.2", "--k-best", "2", "--servers", "2", "--trainers", "1", "--batch", "8", "--latency", "0",
		"--lr", "3e-3", "--warmup", "3", "--eval-tokens", "2000", "--json"}, extra...)
	root := newRootCmd()
	var stdout, stderr syncBuffer
	root.SetArgs(args)
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var res trainer.Result
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout.String())
	}
	return res, stderr.String()
}

// demo moe --data text:PATH trains a DMoE transformer language model
// against in-process expert servers over libp2p on loopback and reports
// its validation perplexity, well below that of a uniform guess.
func TestMoELMDemoText(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corpus.txt")
	s := strings.Repeat("the cat sees the moon. a dog hears the river. my sister likes the green tree. ", 200)
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	res, stderr := runMoELM(t, "text:"+path, "--steps", "40")
	if res.Steps != 40 || res.Failed != 0 || res.Data != "text:"+path || res.Vocab < 257 || res.Vocab > 300 || res.EvalTokens == 0 {
		t.Fatalf("result %+v", res)
	}
	if !(res.ValPerplexity > 1 && res.ValPerplexity < float64(res.Vocab)/4) || math.Abs(math.Log(res.ValPerplexity)-res.ValLoss) > 1e-9 {
		t.Fatalf("validation perplexity %v (loss %v) of a %d-token vocabulary", res.ValPerplexity, res.ValLoss, res.Vocab)
	}
	t.Logf("validation perplexity %.1f of a %d-token vocabulary", res.ValPerplexity, res.Vocab)
	if res.ExpertCalls == 0 || !strings.Contains(stderr, "DMoE language model (2 blocks") {
		t.Fatalf("experts answered %d calls; stderr:\n%s", res.ExpertCalls, stderr)
	}
}

// demo moe --data gcide trains the DMoE language model on the GCIDE
// dictionary.
func TestMoELMDemoGCIDE(t *testing.T) {
	if testing.Short() {
		t.Skip("tokenizes GCIDE and trains over libp2p")
	}
	if _, err := os.Stat(text.DefaultGCIDEPath); err != nil {
		t.Skip("GCIDE not installed")
	}
	res, _ := runMoELM(t, "gcide", "--corpus-bytes", "200000", "--steps", "30")
	if res.Steps != 30 || res.Failed != 0 || res.Data != "gcide" || !(res.ValPerplexity > 1 && res.ValPerplexity < float64(res.Vocab)) {
		t.Fatalf("result %+v", res)
	}
}

// The language-model flags are checked before anything starts.
func TestMoELMFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--data", "text:/nonexistent/corpus.txt"}, "corpus.txt"},
		{[]string{"--data", "gcide", "--heads", "3"}, "--heads"},
		{[]string{"--data", "mnist"}, "want fashion-mnist or text"},
	} {
		var out syncBuffer
		err := runCLI(context.Background(), &out, append([]string{"demo", "moe", "--hidden", "32", "--servers", "1"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error about %q", tc.args, err, tc.want)
		}
	}
}
