package train

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"testing"

	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// A checkpoint describes itself: a reader that knows only the safetensors
// format and docs/checkpoint.md (the layer formulas below, written apart
// from package nn) rebuilds the model from the file's metadata, feeds it a
// raw image the way the metadata says, and gets the logits Skyhive gets.
func TestCheckpointDescribesItself(t *testing.T) {
	for _, spec := range []string{"mlp", "bert-tiny"} {
		t.Run(spec, func(t *testing.T) {
			trainSet, testSet := blobs(t, 64, 32)
			cfg := testConfig(t.TempDir())
			cfg.Model, cfg.Epochs = spec, 1
			in := data.FashionMNISTPreprocessing(true)
			cfg.Input = &in
			if _, err := Run(context.Background(), cfg, trainSet, testSet, io.Discard); err != nil {
				t.Fatal(err)
			}
			f, err := checkpoint.Load(cfg.Checkpoint)
			if err != nil {
				t.Fatal(err)
			}
			if f.Meta["skyhive.task"] != "image classification" {
				t.Fatalf("task %q", f.Meta["skyhive.task"])
			}
			var layers []map[string]any
			var prep struct {
				Image            []int
				Scale, Mean, Std float64
				Classes          []string
			}
			if err := json.Unmarshal([]byte(f.Meta["skyhive.layers"]), &layers); err != nil {
				t.Fatalf("skyhive.layers: %v", err)
			}
			if err := json.Unmarshal([]byte(f.Meta["skyhive.input"]), &prep); err != nil {
				t.Fatalf("skyhive.input: %v", err)
			}
			if len(prep.Image) != 2 || len(prep.Classes) != 10 || prep.Std <= 0 {
				t.Fatalf("skyhive.input %+v", prep)
			}
			// A raw 28×28 image of bytes, fed as the metadata says.
			raw := make([]byte, prep.Image[0]*prep.Image[1])
			for i := range raw {
				raw[i] = byte((i*37 + i/28*11) % 256)
			}
			x := make([]float64, len(raw))
			for i, p := range raw {
				x[i] = (float64(p)*prep.Scale - prep.Mean) / prep.Std
			}
			w := func(name string) []float32 {
				tt, ok := f.Tensors["model/"+name]
				if !ok {
					t.Fatalf("no tensor model/%s", name)
				}
				return tt.Data
			}
			got := readerForward(t, layers, w, x)

			// Skyhive's own answer, on its own preprocessing.
			model, err := models.Build(spec, 1)
			if err != nil {
				t.Fatal(err)
			}
			ws := map[string]*tensor.Tensor{}
			for name, tt := range f.Tensors {
				if n, ok := cutModel(name); ok {
					ws[n] = tt
				}
			}
			if err := nn.ImportParams(model.Params(), ws); err != nil {
				t.Fatal(err)
			}
			xs := tensor.New(1, len(raw))
			for i, p := range raw {
				xs.Data[i] = (float32(p)/255 - data.PixelMean) / data.PixelStd
			}
			want, _ := model.Forward(nn.Ctx{}, xs)
			if len(got) != len(want.Data) {
				t.Fatalf("%d logits, want %d", len(got), len(want.Data))
			}
			for i, v := range want.Data {
				if d := math.Abs(got[i] - float64(v)); d > 1e-3*(1+math.Abs(float64(v))) {
					t.Fatalf("logit %d: reader %v, skyhive %v", i, got[i], v)
				}
			}
		})
	}
}

func cutModel(name string) (string, bool) {
	const p = "model/"
	if len(name) > len(p) && name[:len(p)] == p {
		return name[len(p):], true
	}
	return "", false
}

// readerForward evaluates one example through the described layers with
// plain loops, from the formulas of docs/checkpoint.md. x is [seq·width]
// row-major with the current shape (seq, width).
func readerForward(t *testing.T, layers []map[string]any, w func(string) []float32, x []float64) []float64 {
	t.Helper()
	num := func(l map[string]any, k string) int { v, _ := l[k].(float64); return int(v) }
	seq, width := 1, len(x)
	linear := func(x []float64, seq, in, out int, wt, b []float32) []float64 {
		y := make([]float64, seq*out)
		for s := range seq {
			for o := range out {
				acc := float64(b[o])
				for i := range in {
					acc += x[s*in+i] * float64(wt[i*out+o])
				}
				y[s*out+o] = acc
			}
		}
		return y
	}
	layerNorm := func(x []float64, seq, d int, g, b []float32, eps float64) []float64 {
		y := make([]float64, len(x))
		for s := range seq {
			r := x[s*d : (s+1)*d]
			var mu, v float64
			for _, a := range r {
				mu += a
			}
			mu /= float64(d)
			for _, a := range r {
				v += (a - mu) * (a - mu)
			}
			v /= float64(d)
			for j, a := range r {
				y[s*d+j] = (a-mu)/math.Sqrt(v+eps)*float64(g[j]) + float64(b[j])
			}
		}
		return y
	}
	gelu := func(a float64) float64 {
		return 0.5 * a * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(a+0.044715*a*a*a)))
	}
	attention := func(x []float64, seq, h, heads int, p string, causal bool) []float64 {
		q := linear(x, seq, h, h, w(p+".wq.weight"), w(p+".wq.bias"))
		k := linear(x, seq, h, h, w(p+".wk.weight"), w(p+".wk.bias"))
		v := linear(x, seq, h, h, w(p+".wv.weight"), w(p+".wv.bias"))
		d := h / heads
		ctx := make([]float64, seq*h)
		for hd := range heads {
			for i := range seq {
				sc := make([]float64, seq)
				mx := math.Inf(-1)
				for j := range seq {
					if causal && j > i {
						continue
					}
					for c := range d {
						sc[j] += q[i*h+hd*d+c] * k[j*h+hd*d+c]
					}
					sc[j] /= math.Sqrt(float64(d))
					mx = math.Max(mx, sc[j])
				}
				var z float64
				for j := range seq {
					if causal && j > i {
						sc[j] = 0
						continue
					}
					sc[j] = math.Exp(sc[j] - mx)
					z += sc[j]
				}
				for j := range seq {
					for c := range d {
						ctx[i*h+hd*d+c] += sc[j] / z * v[j*h+hd*d+c]
					}
				}
			}
		}
		return linear(ctx, seq, h, h, w(p+".wo.weight"), w(p+".wo.bias"))
	}
	ffn := func(x []float64, seq, h, inner int, p, act string) []float64 {
		y := linear(x, seq, h, inner, w(p+".fc1.weight"), w(p+".fc1.bias"))
		for i, a := range y {
			if act == "gelu" {
				y[i] = gelu(a)
			} else {
				y[i] = math.Max(a, 0)
			}
		}
		return linear(y, seq, inner, h, w(p+".fc2.weight"), w(p+".fc2.bias"))
	}
	add := func(a, b []float64) []float64 {
		y := make([]float64, len(a))
		for i := range a {
			y[i] = a[i] + b[i]
		}
		return y
	}
	for _, l := range layers {
		name, _ := l["name"].(string)
		switch typ, _ := l["type"].(string); typ {
		case "linear":
			in, out := num(l, "in"), num(l, "out")
			if width != in {
				t.Fatalf("%s: width %d, layer takes %d", name, width, in)
			}
			x, width = linear(x, seq, in, out, w(name+".weight"), w(name+".bias")), out
		case "relu":
			for i, a := range x {
				x[i] = math.Max(a, 0)
			}
		case "gelu":
			for i, a := range x {
				x[i] = gelu(a)
			}
		case "dropout":
		case "patchify":
			size, patch := num(l, "size"), num(l, "patch")
			g := size / patch
			y := make([]float64, 0, len(x))
			for ty := range g {
				for tx := range g {
					for r := range patch {
						y = append(y, x[(ty*patch+r)*size+tx*patch:(ty*patch+r)*size+tx*patch+patch]...)
					}
				}
			}
			x, seq, width = y, g*g, patch*patch
		case "positional_embedding":
			tab := w(name + ".weight")
			for i := range x {
				x[i] += float64(tab[i])
			}
		case "layernorm":
			x = layerNorm(x, seq, width, w(name+".gamma"), w(name+".beta"), l["eps"].(float64))
		case "encoder":
			h, heads, eps := num(l, "hidden"), num(l, "heads"), l["eps"].(float64)
			a := attention(x, seq, h, heads, name+".attn", l["causal"] == true)
			x = layerNorm(add(x, a), seq, h, w(name+".ln1.gamma"), w(name+".ln1.beta"), eps)
			f := ffn(x, seq, h, num(l, "ffn"), name+".ffn", l["activation"].(string))
			x = layerNorm(add(x, f), seq, h, w(name+".ln2.gamma"), w(name+".ln2.beta"), eps)
		case "mean_pool":
			y := make([]float64, width)
			for s := range seq {
				for j := range width {
					y[j] += x[s*width+j] / float64(seq)
				}
			}
			x, seq = y, 1
		default:
			t.Fatalf("%s: the reader does not know layer type %q", name, typ)
		}
	}
	return x
}
