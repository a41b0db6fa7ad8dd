package profile

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-log's process-wide writer, started once by libp2p's logging.
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

func relClose(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*math.Max(math.Abs(a), math.Abs(b))
}

func TestLayersSumToModelCost(t *testing.T) {
	enc, err := nn.BERTEncoder(nn.BERTConfig{Seq: 16, Hidden: 32, Heads: 4, Layers: 3, FFN: 64, Dropout: 0.1},
		rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		model *nn.Sequential
		in    []int
	}{
		{"mlp", mustBuild(t, "mlp"), []int{64, 784}},
		{"bert-tiny", mustBuild(t, "bert-tiny"), []int{8, 784}},
		{"encoder", enc, []int{4, 16, 32}},
		{"encoder-slice", enc.Slice(1, 3), []int{4, 16, 32}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ls, err := Layers(context.Background(), tc.model, tc.in, LayerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != tc.model.Len() {
				t.Fatalf("%d layers, model has %d", len(ls), tc.model.Len())
			}
			mp := &ModelProfile{Format: ModelFormat, Layers: ls}
			tot, want := mp.Totals(), tc.model.Cost(tc.in)
			if !relClose(tot.FwdFLOPs, want.ForwardFLOPs, 1e-12) || !relClose(tot.BwdFLOPs, want.BackwardFLOPs, 1e-12) {
				t.Errorf("FLOPs %g+%g, model %g+%g", tot.FwdFLOPs, tot.BwdFLOPs, want.ForwardFLOPs, want.BackwardFLOPs)
			}
			if tot.Params != want.Params || tot.ParamBytes != 4*want.Params {
				t.Errorf("params %d (%d bytes), model %d", tot.Params, tot.ParamBytes, want.Params)
			}
			if n := nn.NumParams(tc.model.Params()); tot.Params != n {
				t.Errorf("params %d, model's Params() hold %d", tot.Params, n)
			}
			if tot.ActivationBytes != want.ActivationBytes {
				t.Errorf("activations %d, model %d", tot.ActivationBytes, want.ActivationBytes)
			}
			if !reflect.DeepEqual(tot.OutShape, want.OutShape) {
				t.Errorf("out shape %v, model %v", tot.OutShape, want.OutShape)
			}
			for i, l := range ls {
				n := int64(4)
				for _, d := range l.OutShape {
					n *= int64(d)
				}
				if l.OutputBytes != n {
					t.Errorf("layer %d: output bytes %d for shape %v", i, l.OutputBytes, l.OutShape)
				}
			}
			if want := strconv.Itoa(tc.model.Offset()) + "."; !strings.HasPrefix(ls[0].Name, want) {
				t.Errorf("first layer named %q, want prefix %q", ls[0].Name, want)
			}
		})
	}
}

func mustBuild(t *testing.T, name string) *nn.Sequential {
	t.Helper()
	m, err := models.Build(name, 7)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLayersMeasure(t *testing.T) {
	mp, err := ModelLayers(context.Background(), "bert-tiny", 16, LayerOptions{Measure: true, Reps: 3, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !mp.Measured() {
		t.Fatalf("not every layer measured: %+v", mp.Layers)
	}
	if mp.Backend == "" || mp.CPUs <= 0 {
		t.Errorf("machine not recorded: backend %q, %d CPUs", mp.Backend, mp.CPUs)
	}
	// Measured times must track the work: the encoder layers do far more
	// FLOPs than the reshaping layer in front of them, and take longer.
	var enc, patchify Layer
	for _, l := range mp.Layers {
		switch {
		case strings.HasSuffix(l.Name, ".enc"):
			enc = l
		case strings.HasSuffix(l.Name, ".patchify"):
			patchify = l
		}
	}
	if enc.FwdSeconds+enc.BwdSeconds <= patchify.FwdSeconds+patchify.BwdSeconds {
		t.Errorf("encoder layer %.3g s not slower than patchify %.3g s", enc.FwdSeconds+enc.BwdSeconds, patchify.FwdSeconds+patchify.BwdSeconds)
	}
	am, err := mp.AllocTimed(4, 1e11)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range am.Layers {
		if want := mp.Layers[i].FwdSeconds * 1e11; !relClose(l.FwdFLOPs, want, 1e-12) {
			t.Errorf("layer %d: timed FLOPs %g, want %g", i, l.FwdFLOPs, want)
		}
	}
	if am.MicroBatches != 4 {
		t.Errorf("micro-batches %d", am.MicroBatches)
	}
	mp.Layers[0].FwdSeconds = 0
	if _, err := mp.AllocTimed(1, 1e11); err == nil {
		t.Error("AllocTimed accepted a layer without measured time")
	}
	// A cancelled context stops the measurement.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ModelLayers(ctx, "mlp", 8, LayerOptions{Measure: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled measure: %v", err)
	}
}

// The encoder layers of package nn cost what alloc's analytic BERT-large
// generator says they cost (the FLOPs to 0.1%, the activation memory to
// within the counting of small element-wise buffers).
func TestModelLayersMatchesAllocGenerator(t *testing.T) {
	mp, err := ModelLayers(context.Background(), "bert-large:3", 0, LayerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mp.Batch != alloc.DefaultBatch || len(mp.Layers) != 3 || !reflect.DeepEqual(mp.InShape, []int{32, 128, 1024}) {
		t.Fatalf("batch %d, %d layers, input %v", mp.Batch, len(mp.Layers), mp.InShape)
	}
	want := alloc.BertLarge(mp.Batch).Layer("x")
	for i, l := range mp.Layers {
		got := l.Alloc()
		if !relClose(got.FwdFLOPs, want.FwdFLOPs, 1e-3) || !relClose(got.BwdFLOPs, want.BwdFLOPs, 1e-3) {
			t.Errorf("layer %d FLOPs %g+%g, generator %g+%g", i, got.FwdFLOPs, got.BwdFLOPs, want.FwdFLOPs, want.BwdFLOPs)
		}
		if got.ParamBytes != want.ParamBytes || got.OutputBytes != want.OutputBytes {
			t.Errorf("layer %d params %d out %d, generator %d %d", i, got.ParamBytes, got.OutputBytes, want.ParamBytes, want.OutputBytes)
		}
		if !relClose(float64(got.ActivationBytes), float64(want.ActivationBytes), 0.1) {
			t.Errorf("layer %d activations %d, generator %d", i, got.ActivationBytes, want.ActivationBytes)
		}
	}
	if mp.Layers[0].Name == mp.Layers[1].Name {
		t.Error("repeated layers share a name")
	}
	for _, bad := range []string{"bert-large", "bert-large:0", "bert-huge:4", "resnet"} {
		if _, err := ModelLayers(context.Background(), bad, 0, LayerOptions{}); err == nil || !strings.Contains(err.Error(), "deep-mlp:WIDTHxDEPTH") {
			t.Errorf("%q: %v, want an error naming the registry's specs", bad, err)
		}
	}
	// Every registry spec profiles, parameterised ones too.
	if mp, err := ModelLayers(context.Background(), "deep-mlp:16x2", 4, LayerOptions{}); err != nil || len(mp.Layers) != 5 {
		t.Errorf("deep-mlp:16x2: %v, %v", mp, err)
	}
}

func TestReadMemAvailable(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "meminfo")
	os.WriteFile(p, []byte("MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n"), 0o600)
	n, err := ReadMemAvailable(p)
	if err != nil || n != 8000000*1024 {
		t.Fatalf("ReadMemAvailable = %d, %v", n, err)
	}
	os.WriteFile(p, []byte("MemTotal: 1 kB\n"), 0o600)
	if _, err := ReadMemAvailable(p); err == nil {
		t.Error("file without MemAvailable accepted")
	}
	if _, err := ReadMemAvailable(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestMeasureDevice(t *testing.T) {
	shapes := TrainingShapes(64, 64)
	d, err := MeasureDevice(context.Background(), DeviceOptions{Name: "dev", Region: "r", Shapes: shapes, Reps: 3, MemCapBytes: 1 << 20, Slowdown: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !(d.MeasuredSpeed > 1e6) || math.IsInf(d.MeasuredSpeed, 0) {
		t.Fatalf("measured speed %g FLOP/s", d.MeasuredSpeed)
	}
	if !relClose(d.Speed, d.MeasuredSpeed/4, 1e-12) {
		t.Errorf("speed %g with slowdown 4 of %g", d.Speed, d.MeasuredSpeed)
	}
	if len(d.Gemm) != len(shapes) {
		t.Fatalf("%d GEMM results for %d shapes", len(d.Gemm), len(shapes))
	}
	for _, g := range d.Gemm {
		if !(g.MinSeconds <= g.Seconds && g.Seconds <= g.MaxSeconds && g.FLOPS > 0) {
			t.Errorf("%v: median %g min %g max %g", g.GemmShape, g.Seconds, g.MinSeconds, g.MaxSeconds)
		}
	}
	if _, err := os.Stat(MemInfoPath); err == nil {
		if d.MemAvailableBytes <= 1<<20 || d.MemBytes != 1<<20 {
			t.Errorf("memory %d with cap 1 MiB and %d available", d.MemBytes, d.MemAvailableBytes)
		}
		u, err := MeasureDevice(context.Background(), DeviceOptions{Shapes: shapes[:1], Reps: 1})
		if err != nil {
			t.Fatal(err)
		}
		if u.MemBytes != u.MemAvailableBytes || u.Name == "" || u.Slowdown != 1 {
			t.Errorf("uncapped device: %+v", u)
		}
	}
	if err := d.Validate(); err != nil {
		t.Error(err)
	}
	if _, err := MeasureDevice(context.Background(), DeviceOptions{Slowdown: -1}); err == nil {
		t.Error("negative slowdown accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := MeasureDevice(ctx, DeviceOptions{Shapes: shapes, MemCapBytes: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// testCluster is three devices of very different speed and size, the middle
// one far away.
func testCluster() *ClusterProfile {
	return &ClusterProfile{
		Format: ClusterFormat,
		Devices: []Device{
			{Name: "slow", Peer: "12D3KooWslow", Speed: 2e12, MeasuredSpeed: 8e12, Slowdown: 4, MemBytes: 6 << 30},
			{Name: "far", Speed: 10e12, MemBytes: 8 << 30, Region: "remote"},
			{Name: "fast", Speed: 20e12, MemBytes: 10 << 30, Gemm: []GemmResult{{GemmShape: GemmShape{M: 8, N: 8, K: 8}, Seconds: 1, FLOPS: 1024}}},
		},
		Links: []Link{
			{From: "12D3KooWslow", To: "fast", Latency: 0.001, Bandwidth: 1e9, PayloadBytes: 1 << 20},
			{From: "fast", To: "slow", Latency: 0.003, Bandwidth: 3e9},
			{From: "fast", To: "far", Latency: 0.1, Bandwidth: 1e7},
		},
		Inter: LinkSpec{Latency: 0.05, Bandwidth: 1e8},
	}
}

func TestClusterAlloc(t *testing.T) {
	p := testCluster()
	c, err := p.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Devices) != 3 || c.Devices[0].Region != "slow" || c.Devices[1].Region != "remote" || c.Devices[0].Speed != 2e12 {
		t.Fatalf("devices %+v", c.Devices)
	}
	// Both measured directions between slow and fast give the median.
	if l := c.Link(0, 2); !relClose(l.Latency, 0.002, 1e-12) || !relClose(l.Bandwidth, 2e9, 1e-12) {
		t.Errorf("slow–fast link %+v", l)
	}
	if l := c.Link(2, 1); l.Latency != 0.1 || l.Bandwidth != 1e7 {
		t.Errorf("fast–far link %+v", l)
	}
	if l := c.Link(0, 1); l.Latency != 0.05 || l.Bandwidth != 1e8 {
		t.Errorf("unmeasured slow–far link %+v, want the Inter default", l)
	}

	bad := testCluster()
	bad.Links[0].To = "nobody"
	if _, err := bad.Alloc(); err == nil || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("unknown link end: %v", err)
	}
	bad = testCluster()
	bad.Devices[2].Name = "slow"
	if _, err := bad.Alloc(); err == nil {
		t.Error("duplicate device accepted")
	}
	bad = testCluster()
	bad.Devices[1].Speed = 0
	if _, err := bad.Alloc(); err == nil {
		t.Error("zero speed accepted")
	}
}

// A model profile and a cluster profile feed the allocator end to end.
func TestProfilesSolve(t *testing.T) {
	ctx := context.Background()
	mp, err := ModelLayers(ctx, "bert-large:24", 8, LayerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := testCluster().Alloc()
	if err != nil {
		t.Fatal(err)
	}
	p := alloc.Problem{Cluster: c, Model: mp.Alloc(8)}
	even, err := alloc.Solve(ctx, "even", p)
	if err != nil {
		t.Fatal(err)
	}
	sky, err := alloc.Solve(ctx, "skyhive", p)
	if err != nil {
		t.Fatal(err)
	}
	if !sky.Report.Feasible() {
		t.Fatalf("skyhive plan over memory: %+v", sky.Report)
	}
	if sky.Predicted > even.Predicted*(1+1e-9) {
		t.Errorf("skyhive %g s worse than even %g s", sky.Predicted, even.Predicted)
	}
	// The speeds differ tenfold, so a balanced plan must beat the even split.
	if sky.Predicted > 0.9*even.Predicted {
		t.Errorf("skyhive %g s is not clearly faster than even %g s", sky.Predicted, even.Predicted)
	}

	// Shrink the memory below what the model needs: a MemoryError.
	small := testCluster()
	for i := range small.Devices {
		small.Devices[i].MemBytes = 1 << 30
	}
	c, err = small.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	_, err = alloc.Solve(ctx, "skyhive", alloc.Problem{Cluster: c, Model: mp.Alloc(8)})
	var me *alloc.MemoryError
	if !errors.As(err, &me) || me.Missing <= 0 {
		t.Errorf("tiny cluster: %v", err)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()

	cp := testCluster()
	cp.Devices[0].MeasuredAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	path := filepath.Join(dir, "cluster.json")
	if err := Save(path, cp); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseCluster(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cp) {
		t.Errorf("cluster round trip:\n got %+v\nwant %+v", got, cp)
	}
	ac, err := LoadCluster(path)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := cp.Alloc(); !reflect.DeepEqual(ac, want) {
		t.Errorf("LoadCluster %+v, want %+v", ac, want)
	}

	mp, err := ModelLayers(ctx, "mlp", 32, LayerOptions{Measure: true, Reps: 1})
	if err != nil {
		t.Fatal(err)
	}
	mpath := filepath.Join(dir, "model.json")
	if err := Save(mpath, mp); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(mpath)
	gm, err := ParseModel(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gm, mp) {
		t.Errorf("model round trip:\n got %+v\nwant %+v", gm, mp)
	}
	am, err := LoadModel(mpath)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(am, mp.Alloc(0)) {
		t.Errorf("LoadModel %+v", am)
	}
	if am, err := LoadModel("bert-large:4"); err != nil || len(am.Layers) != 4 {
		t.Errorf("LoadModel(spec): %v", err)
	}

	d := cp.Devices[0]
	dpath := filepath.Join(dir, "device.json")
	if err := SaveDevice(dpath, d); err != nil {
		t.Fatal(err)
	}
	gd, err := LoadDevice(dpath)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gd, d) {
		t.Errorf("device round trip:\n got %+v\nwant %+v", gd, d)
	}
	if c, err := LoadCluster(dpath); err != nil || len(c.Devices) != 1 || c.Devices[0].Name != d.Name {
		t.Errorf("LoadCluster(device profile) = %+v, %v", c, err)
	}

	// Strictness: unknown fields, wrong formats, trailing data.
	for name, text := range map[string]string{
		"unknown field": `{"format":"` + ClusterFormat + `","devices":[{"name":"a","speed_flops":1,"mem_bytes":1,"sped":2}]}`,
		"wrong format":  `{"format":"` + ModelFormat + `","devices":[{"name":"a","speed_flops":1,"mem_bytes":1}]}`,
		"trailing":      `{"format":"` + ClusterFormat + `","devices":[{"name":"a","speed_flops":1,"mem_bytes":1}]} {}`,
	} {
		if _, err := ParseCluster([]byte(text)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	// Alloc's own files still load.
	if c, err := LoadCluster(filepath.Join("..", "examples", "cluster-hetero.json")); err != nil || len(c.Devices) != 16 {
		t.Errorf("examples/cluster-hetero.json: %v", err)
	}
}

func TestLoadOrMeasureDevice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev.json")
	o := DeviceOptions{Name: "a", Shapes: TrainingShapes(32, 32), Reps: 1, MemCapBytes: 1 << 30}
	d, err := LoadOrMeasureDevice(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("profile not cached: %v", err)
	}
	// Edit the cached file by hand: the next call must read it, not measure.
	d.MeasuredSpeed, d.Speed = 5e9, 5e9
	if err := SaveDevice(path, d); err != nil {
		t.Fatal(err)
	}
	o.Name, o.Slowdown, o.MemCapBytes = "b", 2, 1<<20
	got, err := LoadOrMeasureDevice(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "b" || got.Speed != 2.5e9 || got.Slowdown != 2 || got.MemBytes != 1<<20 {
		t.Errorf("cached device with overrides: %+v", got)
	}
}
