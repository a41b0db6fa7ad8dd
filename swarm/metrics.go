package swarm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/skyhive/skyhive/clock"
)

// maxSamples bounds the samples kept per metric name; later ones are
// counted in DroppedSamples.
const maxSamples = 1 << 16

// Sample is one time-stamped observation.
type Sample struct {
	Time  time.Time `json:"t"`
	Value float64   `json:"v"`
}

// PeerMetrics is a snapshot of one peer's metrics.
type PeerMetrics struct {
	Counters       map[string]float64  `json:"counters,omitempty"`
	Gauges         map[string]float64  `json:"gauges,omitempty"`
	Samples        map[string][]Sample `json:"samples,omitempty"`
	DroppedSamples int                 `json:"dropped_samples,omitempty"`
}

// Recorder is a peer's metrics sink: counters (summed across peers in the
// report), gauges (last value) and time-stamped samples. It is safe for
// concurrent use.
type Recorder struct {
	clk clock.Clock // stamps samples
	mu  sync.Mutex
	m   PeerMetrics
}

// NewRecorder returns an empty recorder that stamps samples with the wall
// clock. (The swarm gives its goroutine peers recorders on its own clock.)
func NewRecorder() *Recorder { return newRecorder(clock.Real()) }

func newRecorder(clk clock.Clock) *Recorder {
	return &Recorder{clk: clk, m: PeerMetrics{
		Counters: map[string]float64{},
		Gauges:   map[string]float64{},
		Samples:  map[string][]Sample{},
	}}
}

// Add adds delta to counter name.
func (r *Recorder) Add(name string, delta float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m.Counters[name] += delta
}

// Set sets gauge name to v.
func (r *Recorder) Set(name string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m.Gauges[name] = v
}

// Observe records a sample of name taken now.
func (r *Recorder) Observe(name string, v float64) {
	now := r.clk.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m.Samples[name]) >= maxSamples {
		r.m.DroppedSamples++
		return
	}
	r.m.Samples[name] = append(r.m.Samples[name], Sample{Time: now, Value: v})
}

// Snapshot returns a deep copy of the recorded metrics.
func (r *Recorder) Snapshot() PeerMetrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := PeerMetrics{
		Counters:       make(map[string]float64, len(r.m.Counters)),
		Gauges:         make(map[string]float64, len(r.m.Gauges)),
		Samples:        make(map[string][]Sample, len(r.m.Samples)),
		DroppedSamples: r.m.DroppedSamples,
	}
	for k, v := range r.m.Counters {
		s.Counters[k] = v
	}
	for k, v := range r.m.Gauges {
		s.Gauges[k] = v
	}
	for k, v := range r.m.Samples {
		s.Samples[k] = append([]Sample(nil), v...)
	}
	return s
}

// WriteFile atomically writes a JSON snapshot to path (temporary file,
// then rename), so a reader never sees a partial file.
func (r *Recorder) WriteFile(path string) error {
	data, err := json.Marshal(r.Snapshot())
	if err != nil {
		return fmt.Errorf("swarm: metrics: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".metrics-*")
	if err != nil {
		return fmt.Errorf("swarm: metrics: %w", err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("swarm: metrics: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("swarm: metrics: %w", err)
	}
	return nil
}

// readMetricsFile loads a snapshot written by WriteFile.
func readMetricsFile(path string) (PeerMetrics, error) {
	var m PeerMetrics
	data, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("swarm: metrics file %s: %w", path, err)
	}
	return m, nil
}

// Event is one failure-schedule action as it happened.
type Event struct {
	At     time.Duration `json:"at_ns"`    // scheduled offset from the start
	Fired  time.Duration `json:"fired_ns"` // actual offset
	Action string        `json:"action"`
	Peer   string        `json:"peer"`
	Factor float64       `json:"factor,omitempty"`
	Error  string        `json:"error,omitempty"`
}

// PeerReport is one peer's outcome and metrics.
type PeerReport struct {
	Index   int         `json:"index"`
	Name    string      `json:"name"`
	Class   string      `json:"class"`
	Region  string      `json:"region"`
	State   string      `json:"state"`
	Error   string      `json:"error,omitempty"`
	Metrics PeerMetrics `json:"metrics"`
}

// Report is the aggregate of a swarm run, written as JSON.
type Report struct {
	Start  time.Time          `json:"start"`
	End    time.Time          `json:"end"`
	Peers  []PeerReport       `json:"peers"`
	Totals map[string]float64 `json:"totals"` // counters summed over peers
	Events []Event            `json:"events"`
}

// WriteFile writes the report as indented JSON.
func (r Report) WriteFile(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("swarm: report: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("swarm: report: %w", err)
	}
	return nil
}
