package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
)

// train --model bert-mlm-mini --data text:PATH --json trains the masked
// language model with RunMLM: the result has the masked-token perplexity
// and accuracy, the unigram's perplexity on the same positions and the
// fill-mask demonstration, and the checkpoint's metadata describes the
// model.
func TestTrainMLMJSON(t *testing.T) {
	corpus := writeText(t)
	ck := filepath.Join(t.TempDir(), "mlm.safetensors")
	root := newRootCmd()
	var stdout, stderr syncBuffer
	root.SetArgs([]string{"train", "--model", "bert-mlm-mini", "--data", "text:" + corpus, "--vocab", "280", "--seq", "16",
		"--batch", "4", "--time", "1m", "--steps", "15", "--checkpoint", ck, "--json"})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var res train.MLMResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout.String())
	}
	if res.Steps != 15 || res.Model != "bert-mlm-mini:281x16" || res.Vocab != 281 || res.MaskID != 280 || res.ValPerplexity <= 1 ||
		res.UnigramPerplexity <= 1 || res.Ratio != res.ValPerplexity/res.UnigramPerplexity || res.MaskedTokens == 0 ||
		res.ValAccuracy < 0 || res.ValAccuracy > 1 || len(res.FillMask) != 3 || res.Checkpoint != ck {
		t.Fatalf("result %+v", res)
	}
	// Without --lr a masked language model warms up to its registry
	// learning rate (models.DefaultsOf, 1e-3): 15/100 of
	// it at step 15.
	for _, want := range []string{"step 15 (100%): loss", "lr 0.00015,", "validation masked-token perplexity", "fill-mask: "} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("no %q on stderr:\n%s", want, stderr.String())
		}
	}

	f, err := checkpoint.Load(ck)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := text.ParseTokenizer([]byte(f.Meta["skyhive.tokenizer"]))
	if err != nil || tok.VocabSize() != 280 {
		t.Errorf("checkpoint tokenizer: %v", err)
	}
	var layers []nn.LayerInfo
	if err := json.Unmarshal([]byte(f.Meta["skyhive.layers"]), &layers); err != nil || len(layers) != 12 || layers[4].Type != "encoder" || layers[4].Causal || layers[11].Table != "0.embed.weight" {
		t.Errorf("skyhive.layers %s: %v", f.Meta["skyhive.layers"], err)
	}
	var masking text.Masking
	if err := json.Unmarshal([]byte(f.Meta["skyhive.masking"]), &masking); err != nil || masking != text.BERTMasking(280, 280) {
		t.Errorf("skyhive.masking %s: %v", f.Meta["skyhive.masking"], err)
	}
	if f.Meta["skyhive.model"] != res.Model || f.Meta["skyhive.task"] != models.MaskedLM.String() || f.Meta["skyhive.step"] != "15" ||
		!strings.Contains(f.Meta["skyhive.bert"], `"hidden":128`) || !strings.Contains(f.Meta["skyhive.bert"], `"mask_id":280`) {
		t.Errorf("checkpoint metadata %v", f.Meta)
	}
	if m, err := train.LoadMLM(ck); err != nil || m.Spec != res.Model || m.Steps != 15 {
		t.Errorf("LoadMLM: %+v, %v", m, err)
	}

	// Without --json: one line of numbers, then the demonstration.
	var out syncBuffer
	if err := runCLI(context.Background(), &out, "train", "--model", "bert-mlm-mini", "--data", "text:"+corpus, "--vocab", "280", "--seq", "16",
		"--batch", "4", "--steps", "3"); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "validation masked-token perplexity") || !strings.Contains(s, "accuracy") || strings.Count(s, "fill-mask: ") < 3 {
		t.Errorf("output:\n%s", s)
	}
}

// The masked language model's bad input is an error that says what to do,
// and resuming refuses a GPT's checkpoint.
func TestTrainMLMBadInput(t *testing.T) {
	corpus := writeText(t)
	gpt := filepath.Join(t.TempDir(), "gpt.safetensors")
	var out syncBuffer
	if err := runCLI(context.Background(), &out, "train", "--model", "gpt-mini", "--data", "text:"+corpus, "--vocab", "280", "--seq", "16",
		"--batch", "4", "--steps", "2", "--sample-tokens", "0", "--checkpoint", gpt); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--model", "bert-mlm-mini", "--data", "fashion-mnist"}, "train it on text (--data gcide"},
		{[]string{"--model", "bert-mlm-mini", "--data", "text:" + corpus, "--prompt", "The"}, "--prompt is for a GPT's generated sample; bert-mlm-mini is a masked language model"},
		{[]string{"--model", "bert-mlm-mini", "--data", "text:" + corpus, "--sample-tokens", "5"}, "shows fill-mask predictions"},
		{[]string{"--model", "bert-mlm-mini:280x16", "--data", "text:" + corpus, "--vocab", "280"}, "[MASK] needs one more"},
		{[]string{"--model", "bert-mlm-mini", "--data", "text:" + corpus, "--epochs", "2"}, "--epochs is for image models"},
		{[]string{"--model", "mlp", "--vocab", "512"}, "masked: bert-mlm-mini"},
		{[]string{"--model", "bert-mlm-mini", "--data", "text:" + corpus, "--vocab", "280", "--seq", "16", "--steps", "2", "--checkpoint", gpt, "--resume"},
			"holds a causal language model"},
	}
	for _, c := range cases {
		var out syncBuffer
		err := runCLI(context.Background(), &out, append([]string{"train"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}
