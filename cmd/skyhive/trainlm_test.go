package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
)

// writeText writes a small text corpus and returns its path.
func writeText(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "corpus.txt")
	s := strings.Repeat("the cat sees the moon. a dog hears the river. my sister likes the green tree. ", 400)
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// train --model gpt-mini --data text:PATH --json prints the result with
// both perplexities and a sample, and the checkpoint holds the tokenizer.
func TestTrainLMJSON(t *testing.T) {
	corpus := writeText(t)
	ck := filepath.Join(t.TempDir(), "lm.safetensors")
	root := newRootCmd()
	var stdout, stderr syncBuffer
	root.SetArgs([]string{"train", "--model", "gpt-mini", "--data", "text:" + corpus, "--vocab", "280", "--seq", "16",
		"--batch", "4", "--time", "1m", "--steps", "15", "--sample-tokens", "5", "--checkpoint", ck, "--json"})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var res train.LMResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout.String())
	}
	if res.Steps != 15 || res.Model != "gpt-mini:280x16" || res.ValPerplexity <= 1 || res.BigramPerplexity <= 1 ||
		res.Ratio != res.ValPerplexity/res.BigramPerplexity || res.Sample == "" || res.Prompt != train.DefaultPrompt {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(stderr.String(), "step 15 (100%)") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
	f, err := checkpoint.Load(ck)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := text.ParseTokenizer([]byte(f.Meta["skyhive.tokenizer"]))
	if err != nil || tok.VocabSize() != 280 || f.Meta["skyhive.model"] != res.Model || !strings.Contains(f.Meta["skyhive.gpt"], `"hidden":128`) {
		t.Errorf("checkpoint metadata: %v %v", err, f.Meta)
	}
}

// Mismatched models and data, and language-model data errors, say what to
// do.
func TestTrainLMBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "train.bin")
	if err := text.WriteTokenFile(tokens, []int32{5, 70000, 6}, 4); err != nil {
		t.Fatal(err)
	}
	corpus := writeText(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--model", "mlp", "--data", "gcide"}, "train a language model on it (--model gpt-mini)"},
		{[]string{"--model", "gpt-mini", "--data", "fashion-mnist"}, "train it on text (--data gcide"},
		{[]string{"--model", "gpt-mini", "--data", "text:" + empty}, "give a file with text in it"},
		{[]string{"--model", "gpt-mini", "--data", "tokens:" + tokens, "--token-width", "4"}, "give the vocabulary of the token file with --vocab"},
		{[]string{"--model", "gpt-mini", "--data", "tokens:" + tokens, "--token-width", "4", "--vocab", "50257"}, "token id 70000 at position 1 exceeds the vocabulary of 50257: --vocab must be"},
		{[]string{"--model", "gpt-mini", "--data", "text:" + corpus, "--epochs", "2"}, "--epochs is for image models"},
		{[]string{"--model", "mlp", "--vocab", "512"}, "--vocab is for language models"},
		{[]string{"--model", "gpt-mini", "--data", "text:" + corpus, "--duration", "0"}, "give one"},
		{[]string{"--model", "gpt-mini", "--data", "words:" + corpus}, "unknown data set"},
	}
	for _, c := range cases {
		var out syncBuffer
		err := runCLI(context.Background(), &out, append([]string{"train"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}
