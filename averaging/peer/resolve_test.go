package peer

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/launch"
)

// Resolve refuses options of the other kind of model, naming their fields,
// and settles a language model's data and context.
func TestResolve(t *testing.T) {
	lm := launch.Peer{Model: "gpt-mini", Data: "fashion-mnist", Seq: 64, Vocab: 1024, Warmup: 0, Clip: 1}
	cases := []struct {
		name   string
		c      launch.Peer
		given  []string
		fields []string // of the *launch.FieldError; nil: another error
		text   string
	}{
		{"lm option on an image model", launch.Peer{Model: "mlp-small", Data: "fashion-mnist"}, []string{"vocab"}, []string{"vocab"}, "is for language models"},
		{"text for an image model", launch.Peer{Model: "mlp-small", Data: "gcide"}, []string{"data"}, []string{"model"}, "mlp-small is an image classifier and gcide is text"},
		{"unknown image data", launch.Peer{Model: "mlp-small", Data: "cifar"}, []string{"data"}, nil, "unknown data set"},
		{"image option on a language model", lm, []string{"limit"}, []string{"limit", "data"}, "on %s gcide"},
		{"images for a language model", lm, []string{"data"}, []string{"data", "model"}, "gpt-mini is a language model"},
		{"token file without vocabulary", func() launch.Peer { c := lm; c.Data = "tokens:x.bin"; return c }(), []string{"data"}, []string{"data", "vocab"}, "tokens:x.bin"},
		{"negative clip", func() launch.Peer { c := lm; c.Clip = -1; return c }(), nil, []string{"seq", "vocab", "corpus_bytes", "eval_tokens", "warmup", "clip", "weight_decay"}, "must be positive"},
	}
	for _, tc := range cases {
		c := tc.c
		err := Resolve(&c, func(f string) bool { return slices.Contains(tc.given, f) })
		var fe *launch.FieldError
		switch {
		case err == nil:
			t.Errorf("%s: no error", tc.name)
		case errors.As(err, &fe) != (tc.fields != nil) || (fe != nil && !slices.Equal(fe.Fields, tc.fields)):
			t.Errorf("%s: %#v, want fields %v", tc.name, err, tc.fields)
		case !strings.Contains(err.Error(), tc.text) && (fe == nil || !strings.Contains(fe.Text, tc.text)):
			t.Errorf("%s: %v, want it to contain %q", tc.name, err, tc.text)
		}
	}

	c := lm
	if err := Resolve(&c, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if c.Data != "gcide" || c.Seq != 64 || c.Warmup != -1 || c.Clip != 1 || c.CorpusBytes != -1 {
		t.Errorf("language model: %+v", c)
	}
	c = lm
	c.Model, c.Data = "gpt:2x64:500", "text:corpus.txt"
	if err := Resolve(&c, func(f string) bool { return f == "data" }); err != nil || c.Seq != 0 || c.Data != "text:corpus.txt" {
		t.Errorf("spec with a context: %+v, %v", c, err)
	}
	img := launch.Peer{Model: "mlp-small", Data: "fashion-mnist", Seq: 64, Vocab: 1024, Clip: 1, Momentum: 0.9}
	if err := Resolve(&img, func(string) bool { return false }); err != nil || img.Data != "" || img.Seq != 0 || img.Vocab != 0 || img.Clip != 0 || img.Momentum != 0.9 {
		t.Errorf("image model: %+v, %v", img, err)
	}
}

// RunRole refuses a peer without DHT peers, and a stats file it cannot
// open, naming the field, before it starts anything.
func TestRunRoleFieldErrors(t *testing.T) {
	const seed = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	ok := launch.Peer{Algo: "wagma", Model: "mlp-small", InnerSteps: 1, OuterLR: 1, Codec: "none", Aggregation: "mean"}
	noDHT, badStats := ok, ok
	badStats.DHT, badStats.Stats = []string{seed}, t.TempDir()+"/no/such/dir/stats.jsonl"
	for _, c := range []struct {
		l     launch.Peer
		field string
	}{{noDHT, "dht"}, {badStats, "stats"}} {
		var fe *launch.FieldError
		err := RunRole(t.Context(), RoleConfig{Peer: c.l})
		if !errors.As(err, &fe) || !slices.Equal(fe.Fields, []string{c.field}) {
			t.Errorf("%s: got %v, want a *launch.FieldError on it", c.field, err)
		}
	}
}

// A local run of language-model peers drops the image options and takes
// the model's batch and learning rate unless given; --steps alone bounds
// the run.
func TestLocalRunResolve(t *testing.T) {
	r := LocalRun{Peer: launch.Peer{Model: "gpt-mini", Data: "fashion-mnist", Seq: 64, Vocab: 1024,
		Batch: 64, LR: 0.05, Momentum: 0.9, DataDir: "/data", Steps: 10, Duration: launch.Duration(60e9)}}
	if err := r.Resolve(func(f string) bool { return f == "lr" || f == "steps" }); err != nil {
		t.Fatal(err)
	}
	if p := r.Peer; p.Batch != 16 || p.LR != 0.05 || p.Momentum != 0 || p.DataDir != "" || p.Duration != 0 || p.Data != "gcide" {
		t.Errorf("language model: %+v", p)
	}
	img := LocalRun{Peer: launch.Peer{Model: "mlp-small", Data: "fashion-mnist", Batch: 64, LR: 0.05, Momentum: 0.9, Steps: 10, Duration: launch.Duration(60e9)}}
	if err := img.Resolve(func(f string) bool { return f == "duration" }); err != nil || img.Peer.Batch != 64 || img.Peer.Momentum != 0.9 || img.Peer.Duration == 0 {
		t.Errorf("image model: %+v, %v", img.Peer, err)
	}
}
