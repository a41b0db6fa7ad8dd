// Package profile measures what the allocator in package alloc plans with:
// how fast and how large each device is, how fast the links between devices
// are, and what every layer of a model costs.
//
//   - MeasureDevice times tensor.Gemm at the shapes of a training step and
//     reads the available memory; a slowdown factor emulates a slower device.
//   - MeasureLink and MeasureLinks time small round trips (latency) and a
//     streamed payload (bandwidth) to peers over p2p; RegisterHandlers
//     installs the answering side on a host.
//   - Layers and ModelLayers list a model's layers with their FLOPs,
//     parameters and memory from nn.Cost, optionally with measured forward
//     and backward times.
//
// Profiles are JSON files (see docs/profile.md): a ClusterProfile converts to
// an alloc.Cluster, a ModelProfile to an alloc.Model.
package profile

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/stats"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/tensor"
)

// Defaults of DeviceOptions.
const (
	// DefaultTokens is the batch·sequence rows of the benchmark GEMMs.
	DefaultTokens = 512
	// DefaultHidden is the hidden size of the benchmark GEMMs (BERT-large).
	DefaultHidden = 1024
	// DefaultGemmReps is the number of timed repetitions per shape.
	DefaultGemmReps = 5
)

// MemInfoPath is where Linux reports the available memory.
const MemInfoPath = "/proc/meminfo"

// GemmShape is one benchmark GEMM: op(A) is M×K, op(B) is K×N.
type GemmShape struct {
	M      int  `json:"m"`
	N      int  `json:"n"`
	K      int  `json:"k"`
	TransA bool `json:"trans_a,omitempty"`
	TransB bool `json:"trans_b,omitempty"`
}

// FLOPs is 2·M·N·K.
func (s GemmShape) FLOPs() float64 { return 2 * float64(s.M) * float64(s.N) * float64(s.K) }

// String formats the shape as "M×K·K×N" with transposes marked.
func (s GemmShape) String() string {
	a, b := "", ""
	if s.TransA {
		a = "ᵀ"
	}
	if s.TransB {
		b = "ᵀ"
	}
	return fmt.Sprintf("%d×%d%s·%d×%d%s", s.M, s.K, a, s.K, s.N, b)
}

// TrainingShapes returns the three GEMMs of a training step of a
// feed-forward layer [tokens, hidden] → [tokens, 4·hidden]: the forward
// product X·W, the input gradient dY·Wᵀ and the weight gradient Xᵀ·dY.
func TrainingShapes(tokens, hidden int) []GemmShape {
	f := 4 * hidden
	return []GemmShape{
		{M: tokens, N: f, K: hidden},
		{M: tokens, N: hidden, K: f, TransB: true},
		{M: hidden, N: f, K: tokens, TransA: true},
	}
}

// GemmResult is the measured time of one benchmark shape.
type GemmResult struct {
	GemmShape
	// Seconds is the median time of one GEMM; Min and Max show the noise.
	Seconds    float64 `json:"seconds"`
	MinSeconds float64 `json:"min_seconds"`
	MaxSeconds float64 `json:"max_seconds"`
	// FLOPS is FLOPs/Seconds.
	FLOPS float64 `json:"flops_per_s"`
}

// DeviceOptions configures MeasureDevice. The zero value measures this
// machine under its host name with the default shapes.
type DeviceOptions struct {
	// Name of the device (default: the host name).
	Name string
	// Region of the device (see alloc.Device.Region).
	Region string
	// Peer is the device's p2p peer ID, if it has one.
	Peer string
	// Shapes to time (default TrainingShapes(Tokens, Hidden)).
	Shapes []GemmShape
	// Tokens and Hidden size the default shapes (defaults DefaultTokens,
	// DefaultHidden).
	Tokens, Hidden int
	// Reps is the number of timed repetitions per shape after one warm-up
	// (default DefaultGemmReps).
	Reps int
	// MemCapBytes, if positive, caps the reported memory: the device
	// reports min(MemAvailable, MemCapBytes).
	MemCapBytes int64
	// Slowdown divides the measured speed to emulate a slower device
	// (0 means 1, no slowdown; it must not be negative).
	Slowdown float64
	// Seed fills the benchmark matrices.
	Seed uint64
}

// Device is one device's profile.
type Device struct {
	// Name identifies the device; Region is its network region.
	Name   string `json:"name"`
	Region string `json:"region,omitempty"`
	// Peer is its p2p peer ID, if known.
	Peer string `json:"peer,omitempty"`
	// Speed is the effective speed in FLOP/s the allocator plans with:
	// MeasuredSpeed / Slowdown.
	Speed float64 `json:"speed_flops"`
	// MeasuredSpeed is the GEMM speed at training shapes, in FLOP/s: the
	// shapes' total FLOPs over the sum of their median times.
	MeasuredSpeed float64 `json:"measured_speed_flops,omitempty"`
	// Slowdown is the emulated slowdown factor (1: none).
	Slowdown float64 `json:"slowdown,omitempty"`
	// MemBytes is the memory the allocator may fill:
	// min(MemAvailableBytes, MemCapBytes), ignoring a zero term.
	MemBytes int64 `json:"mem_bytes"`
	// MemAvailableBytes is what the operating system reported available.
	MemAvailableBytes int64 `json:"mem_available_bytes,omitempty"`
	// MemCapBytes is the configured cap (0: none).
	MemCapBytes int64 `json:"mem_cap_bytes,omitempty"`
	// Backend is the GEMM backend (tensor.Backend); CPUs the logical CPUs
	// the Go runtime uses.
	Backend string `json:"backend,omitempty"`
	CPUs    int    `json:"cpus,omitempty"`
	// Gemm lists the per-shape measurements.
	Gemm []GemmResult `json:"gemm,omitempty"`
	// MeasuredAt is when the profile was taken.
	MeasuredAt time.Time `json:"measured_at,omitzero"`
}

// Alloc returns the device as the allocator sees it.
func (d Device) Alloc() alloc.Device {
	return alloc.Device{Name: d.Name, Speed: d.Speed, MemBytes: d.MemBytes, Region: d.Region}
}

// Validate checks that the device can be planned with.
func (d Device) Validate() error {
	switch {
	case d.Name == "":
		return errors.New("profile: device without a name")
	case !(d.Speed > 0) || d.Speed > 1e30:
		return fmt.Errorf("profile: device %q: speed %v FLOP/s must be positive and finite", d.Name, d.Speed)
	case d.MemBytes <= 0:
		return fmt.Errorf("profile: device %q: memory %d bytes must be positive", d.Name, d.MemBytes)
	case d.Slowdown < 0:
		return fmt.Errorf("profile: device %q: negative slowdown %v", d.Name, d.Slowdown)
	}
	return nil
}

// MeasureDevice benchmarks this machine: GEMM speed at training shapes and
// available memory. It honours ctx between repetitions.
func MeasureDevice(ctx context.Context, o DeviceOptions) (Device, error) {
	if o.Slowdown < 0 {
		return Device{}, fmt.Errorf("profile: negative slowdown %v", o.Slowdown)
	}
	slow := o.Slowdown
	if slow == 0 {
		slow = 1
	}
	name := o.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return Device{}, fmt.Errorf("profile: device name: %w", err)
		}
		name = h
	}
	avail, err := ReadMemAvailable(MemInfoPath)
	if err != nil && o.MemCapBytes <= 0 {
		return Device{}, fmt.Errorf("profile: available memory unknown and no cap set: %w", err)
	}
	mem := avail
	if o.MemCapBytes > 0 && (mem == 0 || o.MemCapBytes < mem) {
		mem = o.MemCapBytes
	}
	shapes := o.Shapes
	if len(shapes) == 0 {
		tokens, hidden := o.Tokens, o.Hidden
		if tokens <= 0 {
			tokens = DefaultTokens
		}
		if hidden <= 0 {
			hidden = DefaultHidden
		}
		shapes = TrainingShapes(tokens, hidden)
	}
	reps := o.Reps
	if reps <= 0 {
		reps = DefaultGemmReps
	}
	results, err := BenchGemm(ctx, shapes, reps, o.Seed)
	if err != nil {
		return Device{}, err
	}
	var flops, secs float64
	for _, r := range results {
		flops += r.FLOPs()
		secs += r.Seconds
	}
	measured := flops / secs
	return Device{
		Name:              name,
		Region:            o.Region,
		Peer:              o.Peer,
		Speed:             measured / slow,
		MeasuredSpeed:     measured,
		Slowdown:          slow,
		MemBytes:          mem,
		MemAvailableBytes: avail,
		MemCapBytes:       max(o.MemCapBytes, 0),
		Backend:           tensor.Backend(),
		CPUs:              runtime.GOMAXPROCS(0),
		Gemm:              results,
		MeasuredAt:        time.Now().UTC().Round(time.Second),
	}, nil
}

// BenchGemm times tensor.Gemm at each shape: one warm-up, then reps timed
// runs whose median, minimum and maximum it reports.
func BenchGemm(ctx context.Context, shapes []GemmShape, reps int, seed uint64) ([]GemmResult, error) {
	if reps <= 0 {
		return nil, fmt.Errorf("profile: GEMM repetitions must be positive, got %d", reps)
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	out := make([]GemmResult, 0, len(shapes))
	for _, s := range shapes {
		if s.M <= 0 || s.N <= 0 || s.K <= 0 {
			return nil, fmt.Errorf("profile: GEMM shape %v must be positive", s)
		}
		a := make([]float32, s.M*s.K)
		b := make([]float32, s.K*s.N)
		c := make([]float32, s.M*s.N)
		tensor.FillUniform(a, rng, -1, 1)
		tensor.FillUniform(b, rng, -1, 1)
		lda, ldb := s.K, s.N
		if s.TransA {
			lda = s.M
		}
		if s.TransB {
			ldb = s.K
		}
		run := func() {
			tensor.Gemm(s.TransA, s.TransB, s.M, s.N, s.K, 1, a, lda, b, ldb, 0, c, s.N)
		}
		run() // warm-up: page in the buffers, start BLAS threads
		times := make([]float64, reps)
		for i := range times {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("profile: GEMM benchmark: %w", err)
			}
			t0 := time.Now()
			run()
			times[i] = time.Since(t0).Seconds()
		}
		med, lo, hi := medianMinMax(times)
		med = max(med, 1e-9) // a timer of coarse resolution must not yield +Inf
		out = append(out, GemmResult{GemmShape: s, Seconds: med, MinSeconds: lo, MaxSeconds: hi, FLOPS: s.FLOPs() / med})
	}
	return out, nil
}

// ReadMemAvailable returns MemAvailable from a /proc/meminfo-style file, in
// bytes.
func ReadMemAvailable(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("profile: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			break
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("profile: %s: bad MemAvailable %q", path, rest)
		}
		unit := int64(1)
		if len(fields) > 1 {
			switch strings.ToLower(fields[1]) {
			case "kb":
				unit = 1 << 10
			case "mb":
				unit = 1 << 20
			case "gb":
				unit = 1 << 30
			default:
				return 0, fmt.Errorf("profile: %s: unknown unit %q", path, fields[1])
			}
		}
		return n * unit, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("profile: reading %s: %w", path, err)
	}
	return 0, fmt.Errorf("profile: %s has no MemAvailable line", path)
}

// medianMinMax returns the median, minimum and maximum of xs (not empty).
func medianMinMax(xs []float64) (med, lo, hi float64) {
	s := stats.Summarize(xs)
	return s.Median, s.Min, s.Max
}
