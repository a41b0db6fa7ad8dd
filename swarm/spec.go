package swarm

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/skyhive/skyhive/netem"
)

// Spec describes a swarm: device classes with counts and regions, the
// network profile and a failure schedule. Load one with LoadSpec or
// ParseSpec (see docs/swarm.md), or build it in Go and call Validate.
type Spec struct {
	// Profile is the network; nil means regions are plain labels and no
	// links are emulated.
	Profile *netem.Profile
	// Seed seeds the network's jitter and loss.
	Seed uint64
	// Devices lists the device classes; peers are numbered class by class.
	Devices []DeviceClass
	// Failures is the failure schedule.
	Failures []Failure
}

// DeviceClass is a group of identical peers.
type DeviceClass struct {
	// Name names the class; its peers are Name-0, Name-1, ...
	Name string `json:"name"`
	// Count is the number of peers in the class (at least 1).
	Count int `json:"count"`
	// Slowdown is the compute slowdown factor (at least 1; 0 means 1).
	Slowdown float64 `json:"slowdown"`
	// MemoryMB is the memory cap in MiB (0 means none).
	MemoryMB int64 `json:"memory_mb"`
	// Regions are assigned to the class's peers round-robin. Empty means
	// the profile's first region (or "" without a profile).
	Regions []string `json:"regions"`
}

// Failure actions.
const (
	ActionKill     = "kill"     // crash the peer (SIGKILL, or cancel its context)
	ActionPause    = "pause"    // SIGSTOP, or close the pause gate
	ActionResume   = "resume"   // SIGCONT, or reopen the gate
	ActionSlowdown = "slowdown" // set the slowdown factor
)

// Failure is one scheduled action.
type Failure struct {
	// At is the offset from the swarm's start.
	At time.Duration
	// Action is one of kill, pause, resume, slowdown.
	Action string
	// Peer names the target, e.g. "slow-1".
	Peer string
	// For, with pause, schedules the resume after this long.
	For time.Duration
	// Factor is the new slowdown factor for slowdown.
	Factor float64
}

// PeerSpec is one peer as expanded from the device classes.
type PeerSpec struct {
	Index       int
	Name        string
	Class       string
	Region      string
	Slowdown    float64
	MemoryBytes int64
}

// Peers expands the device classes into peers, in index order.
func (s *Spec) Peers() []PeerSpec {
	var out []PeerSpec
	for _, c := range s.Devices {
		slow := c.Slowdown
		if slow == 0 {
			slow = 1
		}
		for i := range c.Count {
			region := ""
			switch {
			case len(c.Regions) > 0:
				region = c.Regions[i%len(c.Regions)]
			case s.Profile != nil:
				region = s.Profile.Regions[0]
			}
			out = append(out, PeerSpec{
				Index:       len(out),
				Name:        fmt.Sprintf("%s-%d", c.Name, i),
				Class:       c.Name,
				Region:      region,
				Slowdown:    slow,
				MemoryBytes: c.MemoryMB << 20,
			})
		}
	}
	return out
}

// Validate checks the spec and returns an error naming the first problem.
func (s *Spec) Validate() error {
	if len(s.Devices) == 0 {
		return errors.New(`swarm: spec: "devices" is empty`)
	}
	if s.Profile != nil {
		if err := s.Profile.Validate(); err != nil {
			return fmt.Errorf("swarm: spec: network: %w", err)
		}
	}
	classes := map[string]bool{}
	for i, c := range s.Devices {
		where := fmt.Sprintf("swarm: spec: devices[%d] (%q)", i, c.Name)
		switch {
		case c.Name == "":
			return fmt.Errorf("swarm: spec: devices[%d]: name is empty", i)
		case classes[c.Name]:
			return fmt.Errorf("%s: class listed twice", where)
		case c.Count < 1:
			return fmt.Errorf("%s: count %d must be at least 1", where, c.Count)
		case c.Slowdown != 0 && checkSlowdown(c.Slowdown) != nil:
			return fmt.Errorf("%s: slowdown %v must be >= 1", where, c.Slowdown)
		case c.MemoryMB < 0:
			return fmt.Errorf("%s: memory_mb %d is negative", where, c.MemoryMB)
		}
		classes[c.Name] = true
		for _, r := range c.Regions {
			if r == "" {
				return fmt.Errorf("%s: empty region name", where)
			}
			if s.Profile != nil {
				if _, ok := s.Profile.RegionIndex(r); !ok {
					return fmt.Errorf("%s: region %q is not in the network profile %v", where, r, s.Profile.Regions)
				}
			}
		}
	}
	names := map[string]bool{}
	for _, p := range s.Peers() {
		names[p.Name] = true
	}
	for i, f := range s.Failures {
		where := fmt.Sprintf("swarm: spec: failures[%d] (%s %s at %v)", i, f.Action, f.Peer, f.At)
		if !names[f.Peer] {
			return fmt.Errorf("%s: no peer named %q", where, f.Peer)
		}
		if f.At < 0 {
			return fmt.Errorf("%s: negative time", where)
		}
		switch f.Action {
		case ActionKill, ActionResume:
		case ActionPause:
			if f.For < 0 {
				return fmt.Errorf("%s: negative \"for\"", where)
			}
		case ActionSlowdown:
			if checkSlowdown(f.Factor) != nil {
				return fmt.Errorf("%s: factor %v must be >= 1", where, f.Factor)
			}
		default:
			return fmt.Errorf("%s: unknown action %q (want kill, pause, resume or slowdown)", where, f.Action)
		}
		if f.For != 0 && f.Action != ActionPause {
			return fmt.Errorf("%s: \"for\" only applies to pause", where)
		}
		if f.Factor != 0 && f.Action != ActionSlowdown {
			return fmt.Errorf("%s: \"factor\" only applies to slowdown", where)
		}
	}
	return nil
}

// schedule expands pauses with a duration into pause + resume and sorts
// the actions by time (stable, so equal times keep file order).
func (s *Spec) schedule() []Failure {
	var out []Failure
	for _, f := range s.Failures {
		out = append(out, f)
		if f.Action == ActionPause && f.For > 0 {
			out = append(out, Failure{At: f.At + f.For, Action: ActionResume, Peer: f.Peer})
		}
	}
	slices.SortStableFunc(out, func(a, b Failure) int { return cmp.Compare(a.At, b.At) })
	return out
}

type specJSON struct {
	Network  json.RawMessage `json:"network"`
	Seed     uint64          `json:"seed"`
	Devices  []DeviceClass   `json:"devices"`
	Failures []failureJSON   `json:"failures"`
}

type failureJSON struct {
	At     string  `json:"at"`
	Action string  `json:"action"`
	Peer   string  `json:"peer"`
	For    string  `json:"for"`
	Factor float64 `json:"factor"`
}

// LoadSpec reads and validates a spec file. A "network" given as a string
// is a profile path relative to the spec file's directory.
func LoadSpec(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	s, err := ParseSpec(data, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseSpec decodes and validates a JSON spec; dir resolves a relative
// network profile path. Unknown fields are rejected.
func ParseSpec(data []byte, dir string) (*Spec, error) {
	var sj specJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sj); err != nil {
		return nil, fmt.Errorf("swarm: decoding spec: %w", err)
	}
	s := &Spec{Seed: sj.Seed, Devices: sj.Devices}
	if len(sj.Network) > 0 && string(sj.Network) != "null" {
		var path string
		if json.Unmarshal(sj.Network, &path) == nil {
			if !filepath.IsAbs(path) {
				path = filepath.Join(dir, path)
			}
			p, err := netem.LoadProfile(path)
			if err != nil {
				return nil, fmt.Errorf("swarm: spec: network: %w", err)
			}
			s.Profile = p
		} else {
			p, err := netem.ParseProfile(sj.Network)
			if err != nil {
				return nil, fmt.Errorf("swarm: spec: network: %w", err)
			}
			s.Profile = p
		}
	}
	for i, fj := range sj.Failures {
		f := Failure{Action: fj.Action, Peer: fj.Peer, Factor: fj.Factor}
		var err error
		if f.At, err = time.ParseDuration(fj.At); err != nil {
			return nil, fmt.Errorf("swarm: spec: failures[%d]: \"at\": %w (write e.g. \"10s\")", i, err)
		}
		if fj.For != "" {
			if f.For, err = time.ParseDuration(fj.For); err != nil {
				return nil, fmt.Errorf("swarm: spec: failures[%d]: \"for\": %w", i, err)
			}
		}
		s.Failures = append(s.Failures, f)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}
