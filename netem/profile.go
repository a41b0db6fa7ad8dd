// Package netem emulates wide-area links between Skyhive peers: per directed
// link latency, jitter, bandwidth and loss, plus partitions and crashed
// peers.
//
// One model (Network) drives three ways of applying it:
//
//   - Deliver, a message-level hook for in-memory transports (it satisfies
//     p2p/memnet's Link interface);
//   - Conn and Proxy, which shape real TCP byte streams on loopback so that
//     unmodified libp2p hosts can talk through emulated links without root;
//   - Topology (Linux, root), one network namespace per peer joined by a
//     user-space router, so that real kernel TCP runs over the emulated links.
//
// Links are described by a Profile, usually loaded from a JSON file that
// names regions and gives latency and bandwidth matrices between them.
// See docs/netem.md.
package netem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"
)

// LinkParams describes one directed link.
type LinkParams struct {
	// Latency is the one-way propagation delay of the link.
	Latency time.Duration
	// Jitter is the half-width of a uniform random variation added to
	// Latency for each message or chunk: the delay lies in
	// [Latency-Jitter, Latency+Jitter], clamped at zero. Messages are never
	// reordered by jitter.
	Jitter time.Duration
	// Bandwidth is the link rate in bits per second; 0 means unlimited.
	Bandwidth float64
	// Loss is the probability in [0, 1) that a message (Deliver), a packet
	// (Topology) or a chunk of a byte stream (Conn, Proxy) is lost.
	Loss float64
}

// Validate reports whether p is usable.
func (p LinkParams) Validate() error {
	switch {
	case p.Latency < 0:
		return fmt.Errorf("latency %v is negative", p.Latency)
	case p.Jitter < 0:
		return fmt.Errorf("jitter %v is negative", p.Jitter)
	case p.Bandwidth < 0 || math.IsNaN(p.Bandwidth) || math.IsInf(p.Bandwidth, 0):
		return fmt.Errorf("bandwidth %v bit/s is not a finite non-negative number", p.Bandwidth)
	case !(p.Loss >= 0 && p.Loss < 1):
		return fmt.Errorf("loss %v is outside [0, 1)", p.Loss)
	}
	return nil
}

// serialization is the time the link needs to put size bytes on the wire.
func (p LinkParams) serialization(size int) time.Duration {
	if p.Bandwidth <= 0 || size <= 0 {
		return 0
	}
	return time.Duration(float64(size) * 8 / p.Bandwidth * float64(time.Second))
}

// Profile is a set of named regions and the links between them. Build one
// with LoadProfile or ParseProfile, or fill the fields and call Validate.
type Profile struct {
	// Regions names the regions; their order indexes the matrices.
	Regions []string
	// Intra applies between two peers of the same region.
	Intra LinkParams
	// Inter[i][j] applies from region i to region j (i != j).
	Inter [][]LinkParams
}

// Uniform returns a one-region profile in which every link has params p.
func Uniform(p LinkParams) *Profile {
	return &Profile{Regions: []string{"default"}, Intra: p, Inter: [][]LinkParams{{p}}}
}

// RegionIndex returns the index of the named region.
func (p *Profile) RegionIndex(name string) (int, bool) {
	for i, r := range p.Regions {
		if r == name {
			return i, true
		}
	}
	return 0, false
}

// Link returns the parameters from region a to region b.
func (p *Profile) Link(a, b string) (LinkParams, error) {
	i, ok := p.RegionIndex(a)
	if !ok {
		return LinkParams{}, fmt.Errorf("netem: unknown region %q", a)
	}
	j, ok := p.RegionIndex(b)
	if !ok {
		return LinkParams{}, fmt.Errorf("netem: unknown region %q", b)
	}
	if i == j {
		return p.Intra, nil
	}
	return p.Inter[i][j], nil
}

// Validate checks that the profile is complete and consistent.
func (p *Profile) Validate() error {
	if len(p.Regions) == 0 {
		return errors.New("netem: profile has no regions")
	}
	seen := make(map[string]bool, len(p.Regions))
	for _, r := range p.Regions {
		if r == "" {
			return errors.New("netem: profile has an empty region name")
		}
		if seen[r] {
			return fmt.Errorf("netem: region %q is listed twice", r)
		}
		seen[r] = true
	}
	if err := p.Intra.Validate(); err != nil {
		return fmt.Errorf("netem: intra-region link: %w", err)
	}
	n := len(p.Regions)
	if len(p.Inter) != n {
		return fmt.Errorf("netem: link matrix has %d rows, want %d (one per region)", len(p.Inter), n)
	}
	for i, row := range p.Inter {
		if len(row) != n {
			return fmt.Errorf("netem: link matrix row %q has %d entries, want %d", p.Regions[i], len(row), n)
		}
		for j, l := range row {
			if i == j {
				continue
			}
			if err := l.Validate(); err != nil {
				return fmt.Errorf("netem: link %s -> %s: %w", p.Regions[i], p.Regions[j], err)
			}
		}
	}
	return nil
}

// profileJSON is the file format documented in docs/netem.md.
type profileJSON struct {
	Regions       []string    `json:"regions"`
	Intra         *intraJSON  `json:"intra"`
	LatencyMS     [][]float64 `json:"latency_ms"`
	BandwidthMbps [][]float64 `json:"bandwidth_mbps"`
	JitterMS      [][]float64 `json:"jitter_ms,omitempty"`
	Loss          [][]float64 `json:"loss,omitempty"`
}

type intraJSON struct {
	LatencyMS     float64 `json:"latency_ms"`
	BandwidthMbps float64 `json:"bandwidth_mbps"`
	JitterMS      float64 `json:"jitter_ms,omitempty"`
	Loss          float64 `json:"loss,omitempty"`
}

// LoadProfile reads and validates a JSON profile file.
func LoadProfile(path string) (*Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("netem: %w", err)
	}
	p, err := ParseProfile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParseProfile decodes and validates a JSON profile. Unknown fields are
// rejected so that typos do not silently fall back to defaults.
func ParseProfile(data []byte) (*Profile, error) {
	var pj profileJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pj); err != nil {
		return nil, fmt.Errorf("netem: decoding profile: %w", err)
	}
	n := len(pj.Regions)
	if n == 0 {
		return nil, errors.New(`netem: profile: "regions" is missing or empty`)
	}
	if pj.Intra == nil {
		return nil, errors.New(`netem: profile: "intra" (same-region link) is missing`)
	}
	p := &Profile{
		Regions: pj.Regions,
		Intra:   pj.Intra.params(),
		Inter:   make([][]LinkParams, n),
	}
	check := func(name string, m [][]float64, required bool) error {
		if m == nil && !required {
			return nil
		}
		if len(m) != n {
			return fmt.Errorf("netem: profile: %q has %d rows, want %d (one per region)", name, len(m), n)
		}
		for i, row := range m {
			if len(row) != n {
				return fmt.Errorf("netem: profile: %q row %d (%s) has %d entries, want %d", name, i, pj.Regions[i], len(row), n)
			}
		}
		return nil
	}
	for _, c := range []struct {
		name string
		m    [][]float64
		req  bool
	}{{"latency_ms", pj.LatencyMS, true}, {"bandwidth_mbps", pj.BandwidthMbps, true}, {"jitter_ms", pj.JitterMS, false}, {"loss", pj.Loss, false}} {
		if err := check(c.name, c.m, c.req); err != nil {
			return nil, err
		}
	}
	for i := range n {
		p.Inter[i] = make([]LinkParams, n)
		for j := range n {
			if i == j {
				p.Inter[i][j] = p.Intra
				continue
			}
			l := LinkParams{
				Latency:   ms(pj.LatencyMS[i][j]),
				Bandwidth: pj.BandwidthMbps[i][j] * 1e6,
			}
			if pj.JitterMS != nil {
				l.Jitter = ms(pj.JitterMS[i][j])
			}
			if pj.Loss != nil {
				l.Loss = pj.Loss[i][j]
			}
			p.Inter[i][j] = l
		}
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

func (ij *intraJSON) params() LinkParams {
	return LinkParams{
		Latency:   ms(ij.LatencyMS),
		Jitter:    ms(ij.JitterMS),
		Bandwidth: ij.BandwidthMbps * 1e6,
		Loss:      ij.Loss,
	}
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
