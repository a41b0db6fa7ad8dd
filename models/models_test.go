package models

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// example is a buildable spec for each registry entry; heavy reports the
// entries too large to build in a unit test (their configuration is checked
// with ParseGPT or ParseMLM instead).
func example(m Model) (spec string, heavy bool) {
	switch m.Name {
	case "deep-mlp":
		return "deep-mlp:16x3", false
	case "bert-stack":
		return "bert-stack:2x64", false
	case "gpt-mini":
		return "gpt-mini:50x16", false
	case "gpt":
		return "gpt:2x64:50x16", false
	case "gpt-small", "gpt-medium", "bert-mlm-base", "bert-mlm-large":
		return m.Name + ":50x16", true
	case "bert-mlm-mini":
		return "bert-mlm-mini:50x16", false
	}
	return m.Usage, false
}

// checksum is an FNV-64a hash of the model's parameter names and the bits
// of their values, in order.
func checksum(m *nn.Sequential) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, p := range m.Params() {
		h.Write([]byte(p.Name))
		for _, v := range p.Value.Data {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			h.Write(b[:])
		}
	}
	return h.Sum64()
}

func numParams(m *nn.Sequential) int {
	n := 0
	for _, p := range m.Params() {
		n += len(p.Value.Data)
	}
	return n
}

func TestEveryListedModelBuilds(t *testing.T) {
	list := List()
	if len(list) == 0 {
		t.Fatal("empty registry")
	}
	for _, m := range list {
		if m.Name == "" || m.Help == "" || !strings.HasPrefix(m.Usage, m.Name) {
			t.Errorf("incomplete entry %+v", m)
		}
		// Each model is listed with its task and objective only.
		lists := map[string]string{"image": Usage(), "causal": LMUsage(), "masked": MLMUsage()}
		own := map[Objective]string{0: "image", CausalLM: "causal", MaskedLM: "masked"}[m.Objective]
		if (m.Task == LanguageModeling) != (m.Objective != 0) || own == "" {
			t.Errorf("%s: task %v with objective %v", m.Usage, m.Task, m.Objective)
		}
		for kind, list := range lists {
			listed := strings.HasPrefix(list, m.Usage+",") || strings.HasPrefix(list, m.Usage+" or ") ||
				strings.Contains(list, " "+m.Usage+",") || strings.Contains(list, " "+m.Usage+" or ") ||
				strings.HasSuffix(list, " "+m.Usage) || list == m.Usage
			if listed != (kind == own) {
				t.Errorf("%s listed in the %s usage %q: %v", m.Usage, kind, list, listed)
			}
		}
		if !strings.Contains(Help(m.Task, "  "), m.Usage) || strings.Contains(Help(1-m.Task, "  "), m.Usage+" ") {
			t.Errorf("%s missing from its task's help or listed in the other's", m.Usage)
		}
		spec, heavy := example(m)
		if got, err := Lookup(spec); err != nil || got != m {
			t.Errorf("Lookup(%q) = %+v, %v", spec, got, err)
		}
		if ObjectiveOf(spec) != m.Objective || ObjectiveOf(m.Name) != m.Objective {
			t.Errorf("ObjectiveOf(%q) = %v, want %v", spec, ObjectiveOf(spec), m.Objective)
		}
		if m.Task == LanguageModeling {
			parse, build, other := func(s string) (float64, int, int, error) {
				c, err := ParseGPT(s)
				return c.NumParams(), c.Vocab, c.Seq, err
			}, BuildLM, BuildMLM
			if m.Objective == MaskedLM {
				parse, build, other = func(s string) (float64, int, int, error) {
					c, err := ParseMLM(s)
					return c.NumParams(), c.Vocab, c.Seq, err
				}, BuildMLM, BuildLM
			}
			n, vocab, seq, err := parse(spec)
			if err != nil || vocab != 50 || seq != 16 {
				t.Errorf("parsing %q: vocab %d, seq %d, %v", spec, vocab, seq, err)
			}
			if heavy {
				continue
			}
			if _, err := Build(spec, 1); err == nil || !strings.Contains(err.Error(), "is a language model") {
				t.Errorf("Build(%q) (the image modes' builder): %v", spec, err)
			}
			if _, err := other(spec, 1); err == nil {
				t.Errorf("%s built by the other objective's builder", spec)
			}
			model, err := build(spec, 1)
			if err != nil {
				t.Fatalf("%s: %v", spec, err)
			}
			c := model.Cost([]int{2, 16})
			y, _ := model.Forward(nn.Ctx{}, tensor.New(2, 16))
			if !slices.Equal(c.OutShape, []int{2, 16, 50}) || !slices.Equal(y.Shape, c.OutShape) {
				t.Errorf("%s: output shape %v, cost says %v, want [2 16 50]", spec, y.Shape, c.OutShape)
			}
			if float64(numParams(model)) != n {
				t.Errorf("%s: %d parameters, config says %v", spec, numParams(model), n)
			}
			continue
		}
		if _, err := ParseGPT(spec); err == nil {
			t.Errorf("ParseGPT accepted image model %s", spec)
		}
		if _, err := BuildLM(spec, 1); err == nil {
			t.Errorf("BuildLM accepted image model %s", spec)
		}
		if _, err := ParseMLM(spec); err == nil {
			t.Errorf("ParseMLM accepted image model %s", spec)
		}
		model, err := Build(spec, 1)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		c := model.Cost([]int{2, InputFeatures})
		if !slices.Equal(c.OutShape, []int{2, Classes}) {
			t.Errorf("%s: output shape %v, want [2 %d]", spec, c.OutShape, Classes)
		}
		y, _ := model.Forward(nn.Ctx{}, tensor.New(2, InputFeatures))
		if !slices.Equal(y.Shape, []int{2, Classes}) {
			t.Errorf("%s: forward gives %v", spec, y.Shape)
		}
	}
}

func TestParamCounts(t *testing.T) {
	for spec, want := range map[string]int{
		"mlp":            784*512 + 512 + 512*256 + 256 + 256*10 + 10,
		"mlp-small":      784*128 + 128 + 128*10 + 10,
		"bert-tiny":      71946,
		"deep-mlp:16x3":  784*16 + 16 + 2*(16*16+16) + 16*10 + 10,
		"deep-mlp:256x6": 784*256 + 256 + 5*(256*256+256) + 256*10 + 10,
		// bert-tiny's geometry with an FFN of 4·64 instead of 128.
		"bert-stack:2x64": 71946 + 2*(2*64*128+128),
		"bert-stack:3x32": 49*32 + 32 + 16*32 + 2*32 + 3*(12*32*32+13*32) + 32*10 + 10,
	} {
		m, err := Build(spec, 3)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if got := numParams(m); got != want {
			t.Errorf("%s: %d parameters, want %d", spec, got, want)
		}
	}
}

func TestSameSeedSameWeights(t *testing.T) {
	for _, m := range List() {
		spec, heavy := example(m)
		if heavy {
			continue
		}
		build := Build
		switch m.Objective {
		case CausalLM:
			build = BuildLM
		case MaskedLM:
			build = BuildMLM
		}
		a, _ := build(spec, 5)
		b, _ := build(spec, 5)
		c, _ := build(spec, 6)
		if checksum(a) != checksum(b) {
			t.Errorf("%s: seed 5 built twice differs", spec)
		}
		if checksum(a) == checksum(c) {
			t.Errorf("%s: seeds 5 and 6 give the same weights", spec)
		}
	}
}

// TestWeightsUnchanged pins the weights to those that train.BuildModel
// (mlp, mlp-small, bert-tiny) and pipeline.BuildModel (deep-mlp) built
// before the registry replaced them, so that checkpoints, averaging peers
// and pipeline workers of older and newer builds still agree.
func TestWeightsUnchanged(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		seed   uint64
		params int
		sum    uint64
	}{
		{"mlp", 1, 535818, 0x572ccdb1f77bd5e0},
		{"mlp", 42, 535818, 0x6002da8108f9725e},
		{"mlp-small", 1, 101770, 0xf54eae743f607d78},
		{"mlp-small", 42, 101770, 0x16de0959f7691be8},
		{"bert-tiny", 1, 71946, 0xd7727da13c39436d},
		{"bert-tiny", 42, 71946, 0xa9cd807aa26338e7},
		{"deep-mlp:16x3", 1, 13274, 0x4500b236e73a0d30},
		{"deep-mlp:16x3", 42, 13274, 0xb97a40d59ea38f54},
		{"deep-mlp:256x6", 1, 532490, 0xf0c266088f4127dc},
		{"deep-mlp:256x6", 42, 532490, 0xb773a22cd24034e2},
	} {
		m, err := Build(tc.spec, tc.seed)
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		if n, sum := numParams(m), checksum(m); n != tc.params || sum != tc.sum {
			t.Errorf("%s seed %d: %d parameters, checksum %#x; before the registry %d, %#x", tc.spec, tc.seed, n, sum, tc.params, tc.sum)
		}
	}
}

func TestBadSpecs(t *testing.T) {
	for _, bad := range []string{
		"", "resnet", "mlp:", "mlp:3", "deep-mlp", "deep-mlp:", "deep-mlp:16", "deep-mlp:x3",
		"deep-mlp:0x3", "deep-mlp:16x0", "deep-mlp:16x3x2", "deep-mlp:8193x1", "deep-mlp:1x257", "MLP",
		"bert-stack:0x64", "bert-stack:64",
	} {
		_, err := Build(bad, 1)
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		for _, m := range List() {
			if m.Task == ImageClassification && !strings.Contains(err.Error(), m.Usage) {
				t.Errorf("%q: error %q does not name %s", bad, err, m.Usage)
			}
		}
	}
	if _, err := Build("deep-mlp:8192x1", 1); err != nil {
		t.Errorf("largest width refused: %v", err)
	}
}

// TestBERTStackSpecs checks the geometry "bert-stack" specs give and the
// bounds that keep a peer from making a worker build an absurd model.
func TestBERTStackSpecs(t *testing.T) {
	for spec, want := range map[string][2]int{ // heads, encoder children
		"bert-stack:2x64":    {1, 2},
		"bert-stack:8x32":    {1, 8},
		"bert-stack:4x256":   {4, 4},
		"bert-stack:24x1024": {16, 24},
	} {
		_, params, _ := strings.Cut(spec, ":")
		cfg, err := BERTStackConfig(params)
		if err != nil {
			t.Errorf("%s: %v", spec, err)
			continue
		}
		if cfg.Heads != want[0] || cfg.Layers != want[1] || cfg.FFN != 4*cfg.Hidden || cfg.Seq != 16 || cfg.Patch != 7 || cfg.Classes != Classes {
			t.Errorf("%s: %+v", spec, cfg)
		}
	}
	// BERT-large's encoder (302M parameters) is within the bounds; its
	// parameter count is checked without building it.
	cfg, _ := BERTStackConfig("24x1024")
	if n := bertStackParams(cfg); math.Abs(n-302.3e6) > 0.5e6 {
		t.Errorf("bert-stack:24x1024 has %v parameters, want about 302M", n)
	}
	m, err := Build("bert-stack:5x64", 2)
	if err != nil {
		t.Fatal(err)
	}
	// The pipeline splits the model at its children: patchify, patch,
	// pos, ln, drop, 5 encoder layers, pool, head.
	if n := len(m.Layers()); n != 5+7 {
		t.Errorf("bert-stack:5x64 has %d children, want 12", n)
	}
	c, _ := BERTStackConfig("5x64")
	if float64(numParams(m)) != bertStackParams(c) {
		t.Errorf("bert-stack:5x64: %d parameters, bertStackParams says %v", numParams(m), bertStackParams(c))
	}
	for _, bad := range []string{
		"bert-stack", "bert-stack:", "bert-stack:4", "bert-stack:x64", "bert-stack:0x64", "bert-stack:257x64",
		"bert-stack:4x7", "bert-stack:4x2049", "bert-stack:4x200", "bert-stack:4x64x2", "bert-stack:-1x64",
		"bert-stack:40x1024", // 504M parameters
	} {
		if _, err := Build(bad, 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestGPTSpecs(t *testing.T) {
	for spec, want := range map[string]nn.GPTConfig{
		"gpt-mini:256":          {Vocab: 256, Seq: DefaultSeq, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
		"gpt-mini:4096x64":      {Vocab: 4096, Seq: 64, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
		"gpt-small:50257x1024":  {Vocab: 50257, Seq: 1024, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1},
		"gpt-medium:30522x128":  {Vocab: 30522, Seq: 128, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1},
		"gpt:6x256:8000":        {Vocab: 8000, Seq: DefaultSeq, Hidden: 256, Heads: 4, Layers: 6, FFN: 1024, Dropout: 0.1},
		"gpt:24x1024:50257x512": {Vocab: 50257, Seq: 512, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1},
	} {
		cfg, err := ParseGPT(spec)
		if err != nil || cfg != want {
			t.Errorf("ParseGPT(%q) = %+v, %v; want %+v", spec, cfg, err, want)
		}
		if m, err := Lookup(spec); err != nil || m.Task != LanguageModeling {
			t.Errorf("Lookup(%q) = %+v, %v", spec, m, err)
		}
	}
	// GPT-2 medium as published: 355M parameters with its vocabulary and
	// context (the tied head adds none).
	cfg, _ := ParseGPT("gpt-medium:50257x1024")
	if n := cfg.NumParams(); math.Abs(n-354.8e6) > 0.5e6 {
		t.Errorf("gpt-medium with GPT-2's vocabulary has %v parameters, want about 355M", n)
	}
	m, err := BuildLM("gpt-mini:64x32", 9)
	if err != nil {
		t.Fatal(err)
	}
	if want := 793344 + 128*(64+32); numParams(m) != want {
		t.Errorf("gpt-mini:64x32 has %d parameters, want %d", numParams(m), want)
	}
	if _, err := ParseGPT("mlp"); err == nil || !strings.Contains(err.Error(), "gpt-mini:VOCAB[xSEQ]") {
		t.Errorf("ParseGPT(mlp): %v", err)
	}
	if _, err := Lookup("resnet"); err == nil {
		t.Error("Lookup accepted an unknown model")
	}
	if ImageClassification.String() != "image classification" || LanguageModeling.String() != "language modeling" {
		t.Error("Task names")
	}
}

// TestMLMSpecs checks the geometry of the BERT masked-language-model
// specs, their bounds, and that the other objective's parsers refuse them
// with an error that says what they are.
func TestMLMSpecs(t *testing.T) {
	for spec, want := range map[string]nn.BERTMLMConfig{
		"bert-mlm-mini:1025":        {Vocab: 1025, Seq: DefaultSeq, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
		"bert-mlm-mini:1025x64":     {Vocab: 1025, Seq: 64, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
		"bert-mlm-base:30522x512":   {Vocab: 30522, Seq: 512, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1},
		"bert-mlm-large:30522x512":  {Vocab: 30522, Seq: 512, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1},
		"bert-mlm-large:50258x1024": {Vocab: 50258, Seq: 1024, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1},
		"bert-mlm-mini:131072x4096": {Vocab: 131072, Seq: 4096, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
		"bert-mlm-base:2x1":         {Vocab: 2, Seq: 1, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1},
		"bert-mlm-large:30522x128":  {Vocab: 30522, Seq: 128, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1},
		"bert-mlm-mini:300x16":      {Vocab: 300, Seq: 16, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
		"bert-mlm-base:50258x128":   {Vocab: 50258, Seq: 128, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1},
		"bert-mlm-mini:65536x1024":  {Vocab: 65536, Seq: 1024, Hidden: 128, Heads: 4, Layers: 4, FFN: 512},
	} {
		cfg, err := ParseMLM(spec)
		if err != nil || cfg != want {
			t.Errorf("ParseMLM(%q) = %+v, %v; want %+v", spec, cfg, err, want)
		}
		if m, err := Lookup(spec); err != nil || m.Task != LanguageModeling || m.Objective != MaskedLM {
			t.Errorf("Lookup(%q) = %+v, %v", spec, m, err)
		}
		if _, err := ParseGPT(spec); err == nil || !strings.Contains(err.Error(), "masked language model (BERT)") {
			t.Errorf("ParseGPT(%q): %v", spec, err)
		}
		if _, err := BuildLM(spec, 1); err == nil {
			t.Errorf("BuildLM(%q) built a BERT", spec)
		}
	}
	m, err := BuildMLM("bert-mlm-mini:64x32", 9)
	if err != nil {
		t.Fatal(err)
	}
	if want := 810112 + 128*(64+32); numParams(m) != want {
		t.Errorf("bert-mlm-mini:64x32 has %d parameters, want %d", numParams(m), want)
	}
	// The [MASK] id is the last of the spec's vocabulary.
	if cfg, _ := ParseMLM("bert-mlm-mini:1025x64"); cfg.MaskID() != 1024 {
		t.Errorf("[MASK] of bert-mlm-mini:1025x64 is %d, want 1024", cfg.MaskID())
	}
	for _, bad := range []string{
		"bert-mlm-mini", "bert-mlm-mini:", "bert-mlm-mini:1", "bert-mlm-mini:0x16", "bert-mlm-mini:64x0",
		"bert-mlm-mini:131073", "bert-mlm-mini:64x4097", "bert-mlm-mini:64x16x2", "bert-mlm-mini:x16", "bert-mlm-mini:-5",
		"bert-mlm-large:131072x4096", "bert-mlm-large:100000x2048", // over 400M parameters
		"bert-mlm", "bert-mlm-huge:64", "bert-large:64", "bert-base:64",
	} {
		if _, err := ParseMLM(bad); err == nil {
			t.Errorf("ParseMLM accepted %q", bad)
		}
		if _, err := BuildMLM(bad, 1); err == nil {
			t.Errorf("BuildMLM accepted %q", bad)
		}
	}
	if _, err := ParseMLM("gpt-mini:64"); err == nil || !strings.Contains(err.Error(), "bert-mlm-mini:VOCAB[xSEQ]") {
		t.Errorf("ParseMLM(gpt-mini:64): %v", err)
	}
	if ObjectiveOf("mlp") != 0 || ObjectiveOf("nothing") != 0 || ObjectiveOf("gpt") != CausalLM || ObjectiveOf("bert-mlm-large") != MaskedLM {
		t.Error("ObjectiveOf")
	}
	if Objective(0).String() != "none" || CausalLM.String() != "causal-lm" || MaskedLM.String() != "masked-lm" {
		t.Error("Objective names")
	}
	// The names profile and alloc give encoder stacks stay theirs.
	for _, m := range List() {
		if m.Name == "bert-large" || m.Name == "bert-base" {
			t.Errorf("the registry takes %s, which names an encoder stack in package alloc", m.Name)
		}
	}
}

// FuzzParseGPT feeds arbitrary specs to the spec parsers: they never panic,
// and what they accept is within the bounds and spelled back the same way.
func FuzzParseGPT(f *testing.F) {
	for _, s := range []string{"gpt-mini:256", "gpt-mini:4096x64", "gpt:6x256:8000x32", "gpt:4x100:256", "mlp", "deep-mlp:3x4", "gpt-small:1x", "", "bert-mlm-mini:1025x64", "bert-mlm-large:9x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		m, lerr := Lookup(spec)
		if mcfg, err := ParseMLM(spec); err == nil {
			if lerr != nil || m.Objective != MaskedLM || mcfg.Validate() != nil || mcfg.NumParams() > maxGPTParams || mcfg.Vocab > maxGPTVocab || mcfg.Seq > maxGPTSeq {
				t.Fatalf("%q accepted as %+v (%+v, %v)", spec, mcfg, m, lerr)
			}
			again := fmt.Sprintf("%s:%dx%d", m.Name, mcfg.Vocab, mcfg.Seq)
			if back, err := ParseMLM(again); err != nil || back != mcfg {
				t.Fatalf("%q gives %+v, but %q gives %+v, %v", spec, mcfg, again, back, err)
			}
		}
		cfg, err := ParseGPT(spec)
		if err != nil {
			return
		}
		if lerr != nil || m.Task != LanguageModeling {
			t.Fatalf("%q parsed but Lookup gives %+v, %v", spec, m, lerr)
		}
		if cfg.Validate() != nil || cfg.NumParams() > maxGPTParams || cfg.Vocab > maxGPTVocab || cfg.Seq > maxGPTSeq {
			t.Fatalf("%q accepted as %+v", spec, cfg)
		}
		again := fmt.Sprintf("%s:%dx%d", m.Name, cfg.Vocab, cfg.Seq)
		if m.Name == "gpt" {
			again = fmt.Sprintf("gpt:%dx%d:%dx%d", cfg.Layers, cfg.Hidden, cfg.Vocab, cfg.Seq)
		}
		if back, err := ParseGPT(again); err != nil || back != cfg {
			t.Fatalf("%q gives %+v, but %q gives %+v, %v", spec, cfg, again, back, err)
		}
	})
}
