package metrics

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
)

// Swarm status records. Every long-running peer stores a small JSON
// record under StatusKey with its own peer ID as the subkey: the DHT only
// accepts a peer-ID subkey signed by that peer (see dht/sign.go), so a
// record says what its peer says about itself and nobody can forge or
// overwrite it. A Publisher re-stores the record every period with an
// expiration a few periods ahead, so a peer that stops disappears on its
// own; ReadStatus fetches them all and drops what does not validate.
//
// This file is the pure core (the record, its bounds, validation, encoding
// and the parsing of a DHT answer); status_publish.go holds the publisher
// and the reader, status_host.go what a libp2p host contributes.

// StatusKey is the DHT key of the status records: a dictionary with one
// subkey per peer, its peer ID.
const StatusKey = "skyhive/status/v1"

// Roles of status records, one per long-running command.
const (
	RoleDHT         = "dht"         // skyhive dht
	RoleServer      = "server"      // skyhive server: mixture-of-experts experts
	RoleTrainer     = "trainer"     // skyhive train moe: trains against expert servers
	RolePeer        = "peer"        // skyhive peer: a data-parallel averaging peer
	RoleCoordinator = "coordinator" // skyhive train pipeline
	RoleWorker      = "worker"      // skyhive worker: a pipeline stage
)

// KnownRole reports whether role is one of the roles above.
func KnownRole(role string) bool {
	switch role {
	case RoleDHT, RoleServer, RoleTrainer, RolePeer, RoleCoordinator, RoleWorker:
		return true
	}
	return false
}

// Bounds of a status record. Records outside them are refused on read, and
// a publisher trims what it would otherwise send (see Encode).
const (
	// MaxStatusBytes bounds an encoded record, so that the records of a
	// large swarm fit in one DHT answer.
	MaxStatusBytes = 4096
	// MaxStatusSkew is how far ahead of the reader's clock a record's
	// time may be, for publishers whose clocks run ahead.
	MaxStatusSkew = time.Minute
	// MinStatusPeriod and MaxStatusPeriod bound the publishing period a
	// record announces.
	MinStatusPeriod = 100 * time.Millisecond
	MaxStatusPeriod = time.Hour
	// MaxAddrs, MaxLinks, MaxExperts and MaxStages bound the lists.
	MaxAddrs   = 4
	MaxLinks   = 16
	MaxExperts = 32
	MaxStages  = 16

	maxText    = 64  // role, version, region, reachability, names, UIDs
	maxAddrLen = 160 // one multiaddr
	maxEvent   = 160 // a pipeline event
	maxRTT     = 1e6 // milliseconds
	maxNumber  = 1e15
)

// Status is one peer's status record. Times are wall-clock; Time is when
// the record was made, which readers show as "last seen".
type Status struct {
	// Peer is the publisher's peer ID, which is also the record's subkey.
	Peer    string `json:"peer"`
	Role    string `json:"role"`
	Version string `json:"version,omitempty"`
	Region  string `json:"region,omitempty"`
	// Addrs are where others reach the peer (multiaddrs ending in
	// /p2p/ID), and Reach how well: "public", "relay", "unreachable",
	// "local" or "unknown" (p2p.Reach.Status).
	Addrs []string `json:"addrs,omitempty"`
	Reach string   `json:"reach,omitempty"`
	// Started is when the peer started, Time when it made this record,
	// PeriodSeconds how often it makes one.
	Started       time.Time `json:"started"`
	Time          time.Time `json:"time"`
	PeriodSeconds float64   `json:"period_seconds"`
	// Step counts the peer's training steps (optimizer updates for an
	// expert server, iterations for a pipeline coordinator), Samples the
	// examples it processed; SamplesPerSecond is its recent throughput.
	Step             int64   `json:"step"`
	Samples          int64   `json:"samples"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Loss is a recent training loss and Accuracy the last evaluation's,
	// when the peer has them.
	Loss     *float64 `json:"loss,omitempty"`
	Accuracy *float64 `json:"accuracy,omitempty"`
	// Links are peers this one is connected to, with round-trip times.
	Links []Link `json:"links,omitempty"`

	// Role-specific parts; at most one is set.
	DHT       *DHTStatus       `json:"dht,omitempty"`
	Averaging *AveragingStatus `json:"averaging,omitempty"`
	Experts   *ExpertsStatus   `json:"experts,omitempty"`
	Pipeline  *PipelineStatus  `json:"pipeline,omitempty"`
}

// Link is a connection to another peer.
type Link struct {
	Peer  string  `json:"peer"`
	RTTMs float64 `json:"rtt_ms"`
}

// DHTStatus is a DHT node's routing table and storage.
type DHTStatus struct {
	Peers   int `json:"peers"`
	Records int `json:"records"`
}

// AveragingStatus is a data-parallel averaging peer's progress.
type AveragingStatus struct {
	Run   string `json:"run,omitempty"`
	Algo  string `json:"algo,omitempty"`
	Round int64  `json:"round"`
	// Groups counts the groups the peer averaged in and GroupMembers
	// their sizes summed; Alone the rounds without a partner; Failures
	// the collectives with failed or missing members.
	Groups       int64 `json:"groups"`
	GroupMembers int64 `json:"group_members"`
	Alone        int64 `json:"alone,omitempty"`
	Failures     int64 `json:"failures,omitempty"`
	// SwarmPeers counts the peers of the run with a fresh progress
	// record, and Epoch is the swarm's epoch.
	SwarmPeers int   `json:"swarm_peers,omitempty"`
	Epoch      int64 `json:"epoch,omitempty"`
}

// ExpertsStatus is what an expert server hosts and serves.
type ExpertsStatus struct {
	// Hosted counts the experts, Requests and Errors the calls answered
	// and failed since the server started.
	Hosted   int   `json:"hosted"`
	Requests int64 `json:"requests"`
	Errors   int64 `json:"errors,omitempty"`
	// Loads lists the busiest experts (all of them if few).
	Loads []ExpertLoad `json:"loads,omitempty"`
}

// ExpertLoad is one expert's counters since its server started.
type ExpertLoad struct {
	UID    string `json:"uid"`
	Calls  int64  `json:"calls"`
	Rows   int64  `json:"rows,omitempty"`
	Errors int64  `json:"errors,omitempty"`
}

// PipelineStatus is a pipeline coordinator's last iteration and plan.
type PipelineStatus struct {
	Iter    int64   `json:"iter"`
	Plan    uint64  `json:"plan"` // the plan's generation
	Seconds float64 `json:"seconds"`
	Workers int     `json:"workers"`
	Event   string  `json:"event,omitempty"`
	Stages  []Stage `json:"stages,omitempty"`
}

// Stage is one pipeline stage of the current plan and its last
// iteration's times.
type Stage struct {
	Stage   int     `json:"stage"`
	Worker  string  `json:"worker"`
	First   int     `json:"first"` // layers [First, Last)
	Last    int     `json:"last"`
	Compute float64 `json:"compute"` // seconds
	Comm    float64 `json:"comm"`
	Idle    float64 `json:"idle"`
}

// Float returns a pointer to v for Status.Loss and Status.Accuracy, or nil if
// v is not a finite number.
func Float(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// Period is the publishing period the record announces.
func (s *Status) Period() time.Duration {
	return time.Duration(s.PeriodSeconds * float64(time.Second))
}

// Alive reports whether the record is recent at now: made less than three
// periods ago, so a peer counts as gone after missing two.
func (s *Status) Alive(now time.Time) bool {
	return now.Sub(s.Time) < 3*s.Period()
}

// ErrStatus wraps the reasons a status record is refused.
var ErrStatus = errors.New("metrics: invalid status record")

// Check validates s as a record read under subkey at now: the peer ID is
// the subkey and names a key that can sign it, the role is known, lengths
// and counts are within bounds, numbers are finite and in range, and the
// record is not from the future beyond MaxStatusSkew.
func (s *Status) Check(subkey string, now time.Time) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrStatus, fmt.Sprintf(format, args...))
	}
	if s.Peer != subkey {
		return bad("peer %.60q under subkey %.60q", s.Peer, subkey)
	}
	if !selfCertifying(s.Peer) {
		return bad("peer %.60q is not a peer ID that embeds its key", s.Peer)
	}
	if !KnownRole(s.Role) {
		return bad("unknown role %.30q", s.Role)
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"version", s.Version, maxText}, {"region", s.Region, maxText}, {"reach", s.Reach, maxText}} {
		if err := checkText(f.v, f.max); err != nil {
			return bad("%s: %v", f.name, err)
		}
	}
	if len(s.Addrs) > MaxAddrs {
		return bad("%d addresses, max %d", len(s.Addrs), MaxAddrs)
	}
	for _, a := range s.Addrs {
		if err := checkText(a, maxAddrLen); err != nil {
			return bad("address: %v", err)
		}
	}
	switch {
	case s.Time.IsZero() || s.Started.IsZero():
		return bad("no time")
	case s.Time.After(now.Add(MaxStatusSkew)):
		return bad("made %v in the future", s.Time.Sub(now).Round(time.Second))
	case s.Started.After(s.Time):
		return bad("started after it was made")
	case !finite(s.PeriodSeconds) || s.Period() < MinStatusPeriod || s.Period() > MaxStatusPeriod:
		return bad("period %v s not in [%v, %v]", s.PeriodSeconds, MinStatusPeriod, MaxStatusPeriod)
	case !count(s.Step) || !count(s.Samples) || !nonNegative(s.SamplesPerSecond):
		return bad("step, samples or samples per second out of range")
	case s.Loss != nil && (!finite(*s.Loss) || math.Abs(*s.Loss) > maxNumber):
		return bad("loss out of range")
	case s.Accuracy != nil && !(*s.Accuracy >= 0 && *s.Accuracy <= 1):
		return bad("accuracy not in [0, 1]")
	case len(s.Links) > MaxLinks:
		return bad("%d links, max %d", len(s.Links), MaxLinks)
	}
	for _, l := range s.Links {
		if err := checkText(l.Peer, maxText+40); err != nil || l.Peer == "" {
			return bad("link peer %.60q", l.Peer)
		}
		if !(l.RTTMs >= 0 && l.RTTMs <= maxRTT) {
			return bad("link round-trip time out of range")
		}
	}
	parts := 0
	if d := s.DHT; d != nil {
		parts++
		if d.Peers < 0 || d.Records < 0 {
			return bad("negative DHT counts")
		}
	}
	if a := s.Averaging; a != nil {
		parts++
		if checkText(a.Run, maxText) != nil || checkText(a.Algo, maxText) != nil {
			return bad("averaging run or algorithm")
		}
		if !count(a.Round) || !count(a.Groups) || !count(a.GroupMembers) || !count(a.Alone) || !count(a.Failures) ||
			!count(a.Epoch) || a.SwarmPeers < 0 {
			return bad("averaging counts out of range")
		}
	}
	if e := s.Experts; e != nil {
		parts++
		if e.Hosted < 0 || !count(e.Requests) || !count(e.Errors) || len(e.Loads) > MaxExperts {
			return bad("expert counts out of range")
		}
		for _, l := range e.Loads {
			if checkText(l.UID, maxText) != nil || l.UID == "" || !count(l.Calls) || !count(l.Rows) || !count(l.Errors) {
				return bad("expert %.60q", l.UID)
			}
		}
	}
	if p := s.Pipeline; p != nil {
		parts++
		if !count(p.Iter) || p.Workers < 0 || !nonNegative(p.Seconds) || checkText(p.Event, maxEvent) != nil || len(p.Stages) > MaxStages {
			return bad("pipeline out of range")
		}
		for _, st := range p.Stages {
			if st.Stage < 0 || st.First < 0 || st.Last < st.First || st.Last > 1<<20 || checkText(st.Worker, maxText) != nil ||
				!nonNegative(st.Compute) || !nonNegative(st.Comm) || !nonNegative(st.Idle) {
				return bad("pipeline stage %d", st.Stage)
			}
		}
	}
	if parts > 1 {
		return bad("%d role-specific parts, max 1", parts)
	}
	return nil
}

// selfCertifying reports whether id is a peer ID in canonical form that
// embeds its public key: the only subkeys the DHT lets just their owner
// write.
func selfCertifying(id string) bool {
	p, err := peer.Decode(id)
	if err != nil || p.String() != id {
		return false
	}
	_, err = p.ExtractPublicKey()
	return err == nil
}

// checkText accepts valid UTF-8 of at most max bytes without control or
// other non-printing characters (which a terminal or a page could
// interpret).
func checkText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes, max %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not UTF-8")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("non-printing character %U", r)
		}
	}
	return nil
}

func finite(v float64) bool      { return !math.IsNaN(v) && !math.IsInf(v, 0) }
func nonNegative(v float64) bool { return v >= 0 && v <= maxNumber }
func count(v int64) bool         { return v >= 0 && v <= maxNumber }

// Sanitize makes a well-meant record valid where it can without losing
// what matters: it drops numbers that are not finite or out of range,
// cuts text, drops the lists' excess and keeps the busiest experts and the
// fastest links. A publisher calls it before Encode, so that a diverged
// loss or a long address does not keep its record off the DHT.
func (s *Status) Sanitize() {
	s.Version, s.Region, s.Reach = cleanText(s.Version, maxText), cleanText(s.Region, maxText), cleanText(s.Reach, maxText)
	s.Addrs = slices.DeleteFunc(slices.Clone(s.Addrs), func(a string) bool { return checkText(a, maxAddrLen) != nil })
	s.Addrs = s.Addrs[:min(len(s.Addrs), MaxAddrs)]
	s.Step, s.Samples = clampCount(s.Step), clampCount(s.Samples)
	s.SamplesPerSecond = clampNumber(s.SamplesPerSecond)
	if s.Loss != nil && (!finite(*s.Loss) || math.Abs(*s.Loss) > maxNumber) {
		s.Loss = nil
	}
	if s.Accuracy != nil && !(*s.Accuracy >= 0 && *s.Accuracy <= 1) {
		s.Accuracy = nil
	}
	links := slices.DeleteFunc(slices.Clone(s.Links), func(l Link) bool {
		return l.Peer == "" || checkText(l.Peer, maxText+40) != nil || !(l.RTTMs >= 0 && l.RTTMs <= maxRTT)
	})
	slices.SortStableFunc(links, func(a, b Link) int { return cmpFloat(a.RTTMs, b.RTTMs) })
	s.Links = links[:min(len(links), MaxLinks)]
	if a := s.Averaging; a != nil {
		c := *a
		c.Run, c.Algo = cleanText(c.Run, maxText), cleanText(c.Algo, maxText)
		c.Round, c.Groups, c.GroupMembers = clampCount(c.Round), clampCount(c.Groups), clampCount(c.GroupMembers)
		c.Alone, c.Failures, c.Epoch = clampCount(c.Alone), clampCount(c.Failures), clampCount(c.Epoch)
		c.SwarmPeers = max(c.SwarmPeers, 0)
		s.Averaging = &c
	}
	if e := s.Experts; e != nil {
		c := *e
		c.Hosted, c.Requests, c.Errors = max(c.Hosted, 0), clampCount(c.Requests), clampCount(c.Errors)
		loads := slices.DeleteFunc(slices.Clone(c.Loads), func(l ExpertLoad) bool { return l.UID == "" || checkText(l.UID, maxText) != nil })
		for i := range loads {
			loads[i].Calls, loads[i].Rows, loads[i].Errors = clampCount(loads[i].Calls), clampCount(loads[i].Rows), clampCount(loads[i].Errors)
		}
		if len(loads) > MaxExperts {
			slices.SortStableFunc(loads, func(a, b ExpertLoad) int { return cmpInt(b.Calls, a.Calls) })
			loads = loads[:MaxExperts]
		}
		c.Loads = loads
		s.Experts = &c
	}
	if p := s.Pipeline; p != nil {
		c := *p
		c.Iter, c.Workers, c.Seconds = clampCount(c.Iter), max(c.Workers, 0), clampNumber(c.Seconds)
		c.Event = cleanText(c.Event, maxEvent)
		stages := slices.Clone(c.Stages[:min(len(c.Stages), MaxStages)])
		for i := range stages {
			st := &stages[i]
			st.Worker = cleanText(st.Worker, maxText)
			st.Stage, st.First = max(st.Stage, 0), max(st.First, 0)
			st.Last = min(max(st.Last, st.First), 1<<20)
			st.First = min(st.First, st.Last)
			st.Compute, st.Comm, st.Idle = clampNumber(st.Compute), clampNumber(st.Comm), clampNumber(st.Idle)
		}
		c.Stages = stages
		s.Pipeline = &c
	}
}

// cleanText cuts s to at most max bytes of printable UTF-8, replacing
// what is not.
func cleanText(s string, max int) string {
	if checkText(s, max) == nil {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "?") {
		if !unicode.IsPrint(r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

func clampCount(v int64) int64 { return min(max(v, 0), int64(maxNumber)) }

func clampNumber(v float64) float64 {
	if !finite(v) || v < 0 {
		return 0
	}
	return min(v, maxNumber)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Encode validates s (as of its own Time) and returns its JSON, at most
// MaxStatusBytes: if it is longer, the slowest links go first, then the
// least busy experts, then the last stages and addresses.
func Encode(s Status) ([]byte, error) {
	if err := s.Check(s.Peer, s.Time); err != nil {
		return nil, err
	}
	for {
		b, err := json.Marshal(&s)
		if err != nil {
			return nil, fmt.Errorf("metrics: encode status: %w", err)
		}
		if len(b) <= MaxStatusBytes {
			return b, nil
		}
		switch {
		case len(s.Links) > 0:
			s.Links = s.Links[:len(s.Links)-1]
		case s.Experts != nil && len(s.Experts.Loads) > 0:
			e := *s.Experts
			e.Loads = slices.Clone(e.Loads)
			slices.SortStableFunc(e.Loads, func(a, b ExpertLoad) int { return cmpInt(b.Calls, a.Calls) })
			e.Loads = e.Loads[:len(e.Loads)-1]
			s.Experts = &e
		case s.Pipeline != nil && len(s.Pipeline.Stages) > 0:
			p := *s.Pipeline
			p.Stages = p.Stages[:len(p.Stages)-1]
			s.Pipeline = &p
		case len(s.Addrs) > 0:
			s.Addrs = s.Addrs[:len(s.Addrs)-1]
		default:
			return nil, fmt.Errorf("%w: %d bytes, max %d", ErrStatus, len(b), MaxStatusBytes)
		}
	}
}

// Decode parses and validates a record read under subkey at now.
func Decode(subkey string, value []byte, now time.Time) (Status, error) {
	if len(value) > MaxStatusBytes {
		return Status{}, fmt.Errorf("%w: %d bytes, max %d", ErrStatus, len(value), MaxStatusBytes)
	}
	var s Status
	if err := json.Unmarshal(value, &s); err != nil {
		return Status{}, fmt.Errorf("%w: %v", ErrStatus, err)
	}
	if err := s.Check(subkey, now); err != nil {
		return Status{}, err
	}
	return s, nil
}

// ParseStatus returns the valid records of a DHT answer for StatusKey at
// now, ordered by role, region and peer, and how many it dropped: expired
// ones, those whose subkey is not a peer ID that only its owner can write
// (anyone could have forged them), those naming another peer than their
// subkey, and those that do not decode or validate.
func ParseStatus(items map[string]dht.Item, now time.Time) ([]Status, int) {
	var out []Status
	dropped := 0
	for sub, it := range items {
		if !it.Expiration.After(now) {
			dropped++
			continue
		}
		s, err := Decode(sub, it.Value, now)
		if err != nil {
			dropped++
			continue
		}
		out = append(out, s)
	}
	SortStatus(out)
	return out, dropped
}

// SortStatus orders records by role, region and peer.
func SortStatus(ss []Status) {
	slices.SortFunc(ss, func(a, b Status) int {
		if c := strings.Compare(a.Role, b.Role); c != 0 {
			return c
		}
		if c := strings.Compare(a.Region, b.Region); c != 0 {
			return c
		}
		return strings.Compare(a.Peer, b.Peer)
	})
}

// BuildVersion is this binary's version for status records: the main
// module's version and, in a build from a VCS checkout, the commit (with
// "+dirty" for uncommitted changes).
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), 12)]
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" && (v == "(devel)" || !strings.Contains(v, rev)) {
		v += " " + rev + dirty
	}
	return cleanText(v, maxText)
}
