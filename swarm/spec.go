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
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/netem"
)

// Spec describes a swarm: device classes with counts and regions, the
// network profile and a failure schedule. Load one with LoadSpec or
// ParseSpec (see docs/swarm.md), or build it in Go and call Validate.
type Spec struct {
	// Name names the swarm in reports (the benchmark protocol's case).
	Name string
	// Isolation says how Run starts the peers: IsolationNamespaces (one
	// network namespace per peer, root only), IsolationProcesses (child
	// processes on loopback, links not emulated) or "" (namespaces when
	// possible, else processes).
	Isolation string
	// Timeout bounds a Run: peers still running then are stopped and the
	// run fails (0: DefaultTimeout).
	Timeout time.Duration
	// Profile is the network; nil means regions are plain labels and no
	// links are emulated.
	Profile *netem.Profile
	// Seed seeds the network's jitter and loss.
	Seed uint64
	// Devices lists the device classes; peers are numbered class by class.
	Devices []DeviceClass
	// Failures is the failure schedule.
	Failures []Failure
	// Closed closes the swarm to strangers: Run makes a swarm secret in
	// its directory and gives it (--swarm-secret) to every peer but the
	// Stranger classes'.
	Closed bool
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
	// Role is what Run starts for each peer of the class (see the Role
	// constants); empty for swarms of goroutines or custom launchers.
	Role string `json:"role"`
	// Config is the typed config of the role's process (a launch.Peer for
	// RolePeer, launch.Server for RoleServer, launch.DHT for RoleDHT and
	// RoleRelay, launch.MoETrainer for RoleTrainer, launch.Pipeline for
	// RoleCoordinator, launch.Worker for RoleWorker; nil: the role's
	// defaults). Run sets the fields that connect the peer (see
	// RunnerFields). In its strings "{i}" is replaced by the peer's index
	// in its class and "{n}" by the class's count (e.g. Shard "{i}/{n}").
	// In a spec file it is the class's "config" object.
	Config launch.Config `json:"-"`
	// Start delays the class's launch: its peers join late.
	Start time.Duration `json:"-"`
	// NAT puts the class's peers behind a NAT that accepts no inbound
	// connections (namespaces only); they join through a relay.
	NAT bool `json:"nat"`
	// Stranger leaves the class's peers out of a closed swarm: they get no
	// secret, so the others must refuse them. Their failure is expected
	// and does not fail the run.
	Stranger bool `json:"stranger"`
}

// Roles: what Run starts for a peer, and the skyhive command it runs.
const (
	RoleDHT         = "dht"         // skyhive dht: a bootstrap node (service)
	RoleRelay       = "relay"       // skyhive dht --relay-service: bootstrap and circuit relay (service)
	RoleServer      = "server"      // skyhive server: MoE expert server (service)
	RoleTrainer     = "trainer"     // skyhive train moe: MoE trainer
	RolePeer        = "peer"        // skyhive peer: group-averaging peer
	RoleCoordinator = "coordinator" // skyhive train pipeline --join-wait: pipeline coordinator
	RoleWorker      = "worker"      // skyhive worker: pipeline worker (service)
)

// Isolation modes of Run.
const (
	IsolationNamespaces = "namespaces"
	IsolationProcesses  = "processes"
)

// DefaultTimeout bounds a Run whose spec gives no timeout.
const DefaultTimeout = 10 * time.Minute

// IsService tells whether a role runs until stopped (services) or ends
// by itself when its work is done (the run waits for those).
func IsService(role string) bool {
	switch role {
	case RoleDHT, RoleRelay, RoleServer, RoleWorker:
		return true
	}
	return false
}

var knownRoles = []string{RoleDHT, RoleRelay, RoleServer, RoleTrainer, RolePeer, RoleCoordinator, RoleWorker}

// Failure actions.
const (
	ActionKill      = "kill"      // crash the peer (SIGKILL, or cancel its context)
	ActionPause     = "pause"     // SIGSTOP, or close the pause gate
	ActionResume    = "resume"    // SIGCONT, or reopen the gate
	ActionSlowdown  = "slowdown"  // set the slowdown factor
	ActionPartition = "partition" // cut the peer off from every other (needs a network)
	ActionRejoin    = "rejoin"    // restart a killed peer, or heal a partitioned one
)

// Failure is one scheduled action.
type Failure struct {
	// At is the offset from the swarm's start.
	At time.Duration
	// Action is one of kill, pause, resume, slowdown, partition, rejoin.
	Action string
	// Peer names the target, e.g. "slow-1".
	Peer string
	// For, with pause or partition, schedules the resume or rejoin after
	// this long.
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
	Role        string
	// Config is the class's config with "{i}" and "{n}" replaced (nil:
	// none).
	Config   launch.Config
	Start    time.Duration
	NAT      bool
	Stranger bool
	// ClassIndex and ClassCount place the peer in its class: it is peer
	// ClassIndex of ClassCount.
	ClassIndex, ClassCount int
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
				Role:        c.Role,
				Config:      classConfig(c.Config, i, c.Count),
				ClassIndex:  i,
				ClassCount:  c.Count,
				Start:       c.Start,
				NAT:         c.NAT,
				Stranger:    c.Stranger,
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
	switch s.Isolation {
	case "", IsolationNamespaces, IsolationProcesses:
	default:
		return fmt.Errorf("swarm: spec: isolation %q: want %q or %q (or leave it out)", s.Isolation, IsolationNamespaces, IsolationProcesses)
	}
	if s.Timeout < 0 {
		return fmt.Errorf("swarm: spec: timeout %v is negative", s.Timeout)
	}
	if s.Profile != nil {
		if err := s.Profile.Validate(); err != nil {
			return fmt.Errorf("swarm: spec: network: %w", err)
		}
	}
	classes := map[string]bool{}
	roles := map[string]int{}
	nat := false
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
		case c.Start < 0:
			return fmt.Errorf("%s: start %v is negative", where, c.Start)
		case c.Role != "" && !slices.Contains(knownRoles, c.Role):
			return fmt.Errorf("%s: unknown role %q (want one of %v)", where, c.Role, knownRoles)
		case c.Stranger && !s.Closed:
			return fmt.Errorf(`%s: "stranger" needs "closed": true (in an open swarm everyone is welcome)`, where)
		}
		if err := checkConfig(c.Role, c.Config); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		classes[c.Name] = true
		roles[c.Role] += c.Count
		nat = nat || c.NAT
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
	if err := checkRoles(roles, nat); err != nil {
		return err
	}
	return s.validateFailures()
}

// checkRoles checks that the roles of a swarm fit together.
func checkRoles(roles map[string]int, nat bool) error {
	if roles[""] > 0 && len(roles) > 1 {
		return errors.New(`swarm: spec: either every device class has a "role" (for swarm run) or none has`)
	}
	seeds := roles[RoleDHT] + roles[RoleRelay]
	switch {
	case roles[RoleCoordinator] > 1:
		return fmt.Errorf("swarm: spec: %d coordinators; a pipeline has one", roles[RoleCoordinator])
	case roles[RoleWorker] > 0 && roles[RoleCoordinator] == 0:
		return errors.New(`swarm: spec: workers need a device class with "role": "coordinator"`)
	case roles[RoleCoordinator] > 0 && roles[RoleWorker] == 0:
		return errors.New(`swarm: spec: the coordinator needs a device class with "role": "worker"`)
	case roles[RoleServer]+roles[RoleTrainer]+roles[RolePeer] > 0 && seeds == 0:
		return errors.New(`swarm: spec: servers, trainers and peers join through a DHT: add a device class with "role": "dht" (or "relay")`)
	case roles[RoleTrainer] > 0 && roles[RoleServer] == 0:
		return errors.New(`swarm: spec: trainers need expert servers: add a device class with "role": "server"`)
	case nat && roles[RoleRelay] == 0:
		return errors.New(`swarm: spec: peers behind a NAT ("nat": true) join through a relay: add a device class with "role": "relay"`)
	}
	return nil
}

// roleConfig returns a pointer to a zero config of the launch role that a
// swarm role runs, or nil for no role.
func roleConfig(role string) launch.Config {
	name := map[string]string{
		RoleDHT: launch.RoleDHT, RoleRelay: launch.RoleDHT, RoleServer: launch.RoleServer, RoleTrainer: launch.RoleMoETrainer,
		RolePeer: launch.RolePeer, RoleCoordinator: launch.RolePipeline, RoleWorker: launch.RoleWorker,
	}[role]
	c, _ := launch.New(name)
	return c
}

// classConfig returns a class's config for its peer i of n: "{i}" becomes
// i and "{n}" becomes n in its strings. It returns a pointer to a copy.
func classConfig(cfg launch.Config, i, n int) launch.Config {
	if cfg == nil {
		return nil
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return cfg // checkConfig refuses it
	}
	r := strings.NewReplacer("{i}", strconv.Itoa(i), "{n}", strconv.Itoa(n))
	out, ok := launch.New(cfg.Role())
	if !ok || json.Unmarshal([]byte(r.Replace(string(b))), out) != nil {
		return cfg
	}
	return out
}

// RunnerFields are the config fields (by JSON name) that Run sets for
// every peer; a spec may not set them.
var RunnerFields = []string{"listen", "identity", "dht", "relay", "json", "join", "join_wait", "name", "region", "swarm_secret", "swarm_key", "member_token"}

// checkConfig checks a class's config: of the role's type, encodable, and
// leaving RunnerFields to Run.
func checkConfig(role string, cfg launch.Config) error {
	if cfg == nil {
		return nil
	}
	want := roleConfig(role)
	if want == nil {
		return errors.New("config: a class with a config needs a role")
	}
	if cfg.Role() != want.Role() {
		return fmt.Errorf("config: a %s config for role %s (want %s)", cfg.Role(), role, want.Role())
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var set map[string]json.RawMessage
	if err := json.Unmarshal(b, &set); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for _, f := range RunnerFields {
		if _, ok := set[f]; ok {
			return fmt.Errorf("config: %q is set by swarm run for every peer; leave it out", f)
		}
	}
	return nil
}

// validateFailures checks the schedule, following each peer's state
// (not started, up, killed, partitioned) through it in time order.
func (s *Spec) validateFailures() error {
	start := map[string]time.Duration{}
	hasNet := s.Profile != nil
	for _, p := range s.Peers() {
		start[p.Name] = p.Start
	}
	for i, f := range s.Failures {
		where := fmt.Sprintf("swarm: spec: failures[%d] (%s %s at %v)", i, f.Action, f.Peer, f.At)
		st, ok := start[f.Peer]
		if !ok {
			return fmt.Errorf("%s: no peer named %q", where, f.Peer)
		}
		if f.At < 0 {
			return fmt.Errorf("%s: negative time", where)
		}
		if f.At < st {
			return fmt.Errorf("%s: the peer starts only at %v", where, st)
		}
		switch f.Action {
		case ActionKill, ActionResume, ActionRejoin:
		case ActionPause, ActionPartition:
			if f.For < 0 {
				return fmt.Errorf("%s: negative \"for\"", where)
			}
			if f.Action == ActionPartition && !hasNet {
				return fmt.Errorf("%s: a partition needs a \"network\"", where)
			}
		case ActionSlowdown:
			if checkSlowdown(f.Factor) != nil {
				return fmt.Errorf("%s: factor %v must be >= 1", where, f.Factor)
			}
		default:
			return fmt.Errorf("%s: unknown action %q (want kill, pause, resume, slowdown, partition or rejoin)", where, f.Action)
		}
		if f.For != 0 && f.Action != ActionPause && f.Action != ActionPartition {
			return fmt.Errorf("%s: \"for\" only applies to pause and partition", where)
		}
		if f.Factor != 0 && f.Action != ActionSlowdown {
			return fmt.Errorf("%s: \"factor\" only applies to slowdown", where)
		}
	}
	// Follow each peer: a rejoin needs a killed or partitioned peer.
	down, cut := map[string]bool{}, map[string]bool{}
	for _, f := range s.schedule() {
		switch f.Action {
		case ActionKill:
			down[f.Peer] = true
		case ActionPartition:
			if down[f.Peer] {
				return fmt.Errorf("swarm: spec: partition %s at %v: the peer was killed", f.Peer, f.At)
			}
			cut[f.Peer] = true
		case ActionRejoin:
			if !down[f.Peer] && !cut[f.Peer] {
				return fmt.Errorf("swarm: spec: rejoin %s at %v: the peer is neither killed nor partitioned then", f.Peer, f.At)
			}
			down[f.Peer], cut[f.Peer] = false, false
		}
	}
	return nil
}

// launches returns, per peer, the offsets at which it is (re)started: its
// class's start, and each rejoin that follows a kill.
func (s *Spec) launches() map[string][]time.Duration {
	out := map[string][]time.Duration{}
	for _, p := range s.Peers() {
		out[p.Name] = []time.Duration{p.Start}
	}
	down := map[string]bool{}
	for _, f := range s.schedule() {
		switch f.Action {
		case ActionKill:
			down[f.Peer] = true
		case ActionRejoin:
			if down[f.Peer] {
				out[f.Peer] = append(out[f.Peer], f.At)
			}
			down[f.Peer] = false
		}
	}
	return out
}

// schedule expands pauses with a duration into pause + resume and sorts
// the actions by time (stable, so equal times keep file order).
func (s *Spec) schedule() []Failure {
	var out []Failure
	for _, f := range s.Failures {
		out = append(out, f)
		switch {
		case f.Action == ActionPause && f.For > 0:
			out = append(out, Failure{At: f.At + f.For, Action: ActionResume, Peer: f.Peer})
		case f.Action == ActionPartition && f.For > 0:
			out = append(out, Failure{At: f.At + f.For, Action: ActionRejoin, Peer: f.Peer})
		}
	}
	slices.SortStableFunc(out, func(a, b Failure) int { return cmp.Compare(a.At, b.At) })
	return out
}

// actionStart is a late class's first start in scheduleWithStarts.
const actionStart = "start"

// scheduleWithStarts is the schedule with the late classes' starts added.
func (s *Spec) scheduleWithStarts() []Failure {
	var out []Failure
	for _, p := range s.Peers() {
		if p.Start > 0 {
			out = append(out, Failure{At: p.Start, Action: actionStart, Peer: p.Name})
		}
	}
	out = append(out, s.schedule()...)
	slices.SortStableFunc(out, func(a, b Failure) int { return cmp.Compare(a.At, b.At) })
	return out
}

type specJSON struct {
	Name      string          `json:"name"`
	Isolation string          `json:"isolation"`
	Timeout   string          `json:"timeout"`
	Network   json.RawMessage `json:"network"`
	Seed      uint64          `json:"seed"`
	Devices   []classJSON     `json:"devices"`
	Failures  []failureJSON   `json:"failures"`
	Closed    bool            `json:"closed"`
}

type classJSON struct {
	DeviceClass
	Start  string          `json:"start"`
	Config json.RawMessage `json:"config"`
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
	s := &Spec{Name: sj.Name, Isolation: sj.Isolation, Seed: sj.Seed, Closed: sj.Closed}
	if sj.Timeout != "" {
		var err error
		if s.Timeout, err = time.ParseDuration(sj.Timeout); err != nil {
			return nil, fmt.Errorf("swarm: spec: \"timeout\": %w (write e.g. \"4m\")", err)
		}
	}
	for i, cj := range sj.Devices {
		c := cj.DeviceClass
		if len(cj.Config) > 0 && string(cj.Config) != "null" {
			cfg := roleConfig(c.Role)
			if cfg == nil {
				return nil, fmt.Errorf("swarm: spec: devices[%d]: \"config\" needs a known \"role\", got %q", i, c.Role)
			}
			if err := (launch.File{Role: cfg.Role(), Config: cj.Config}).Decode(cfg); err != nil {
				return nil, fmt.Errorf("swarm: spec: devices[%d]: \"config\": %w", i, err)
			}
			c.Config = cfg
		}
		if cj.Start != "" {
			var err error
			if c.Start, err = time.ParseDuration(cj.Start); err != nil {
				return nil, fmt.Errorf("swarm: spec: devices[%d]: \"start\": %w (write e.g. \"20s\")", i, err)
			}
		}
		s.Devices = append(s.Devices, c)
	}
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
