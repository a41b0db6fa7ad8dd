package models

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// example is a buildable spec for each registry entry.
func example(m Model) string {
	if m.Name == "deep-mlp" {
		return "deep-mlp:16x3"
	}
	return m.Usage
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
		if !strings.Contains(Usage(), m.Usage) || !strings.Contains(Help("  "), m.Usage) {
			t.Errorf("%s missing from Usage or Help", m.Usage)
		}
		spec := example(m)
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
		spec := example(m)
		a, _ := Build(spec, 5)
		b, _ := Build(spec, 5)
		c, _ := Build(spec, 6)
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
	} {
		_, err := Build(bad, 1)
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		for _, m := range List() {
			if !strings.Contains(err.Error(), m.Usage) {
				t.Errorf("%q: error %q does not name %s", bad, err, m.Usage)
			}
		}
	}
	if _, err := Build("deep-mlp:8192x1", 1); err != nil {
		t.Errorf("largest width refused: %v", err)
	}
}
