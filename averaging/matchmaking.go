package averaging

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/p2p"
)

// Matchmaking names how a peer finds the members of its groups.
type Matchmaking string

// Matchmaking modes.
const (
	// MatchRanks forms WAGMA's butterfly groups from fixed ranks (a
	// roster known to every peer).
	MatchRanks Matchmaking = "ranks"
	// MatchDHT forms groups without ranks, Moshpit-style: every round each
	// peer declares itself in the DHT under a key made of the run, the
	// round and its grid coordinates except one dimension, and averages
	// with whoever declared under the same key.
	MatchDHT Matchmaking = "dht"
)

// ParseMatchmaking returns the matchmaking mode named s ("" is ranks).
func ParseMatchmaking(s string) (Matchmaking, error) {
	switch m := Matchmaking(s); m {
	case "", MatchRanks:
		return MatchRanks, nil
	case MatchDHT:
		return m, nil
	}
	return "", fmt.Errorf("averaging: unknown matchmaking %q (want ranks or dht)", s)
}

// Defaults of DHT matchmaking.
const (
	DefaultRoundInterval = 2 * time.Second
	DefaultGridDims      = 2
	// maxDeclaration bounds a declaration read from the DHT.
	maxDeclaration = 4 << 10
	maxDeclAddrs   = 16
)

// GroupKey is the DHT key under which a peer with the given grid
// coordinates declares itself in a round: the run, the round and every
// coordinate except the one of dimension round mod len(coords), which is
// the dimension the round averages along (Moshpit SGD's grid). Peers that
// agree on all other coordinates meet under the same key.
func GroupKey(run string, round int, coords []int) string {
	var b strings.Builder
	b.WriteString(run)
	b.WriteString("/mm/")
	b.WriteString(strconv.Itoa(round))
	k := round % max(len(coords), 1)
	for i, c := range coords {
		b.WriteByte('/')
		if i == k {
			b.WriteByte('*')
		} else {
			b.WriteString(strconv.Itoa(c))
		}
	}
	return b.String()
}

// PeersKey is the DHT key under which the peers of a run list themselves
// (subkey: peer ID) so that a peer joining late finds one to fetch the
// model from.
func PeersKey(run string) string { return run + "/peers" }

// permute shuffles ids (sorted) with a permutation seeded by key, so that
// every peer that read the same declarations under key orders them alike.
func permute(ids []peer.ID, key string) {
	h := fnv.New64a()
	h.Write([]byte(key))
	rng := rand.New(rand.NewPCG(h.Sum64(), 0x6d6d))
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
}

// SplitGroup cuts the duplicate-free list ids (in the same order on every
// peer) into the fewest consecutive groups of at most size members each,
// of near-equal sizes, and returns the one holding self with self's index
// in it (-1 if self is not in ids). Every peer that sees the same list
// computes the same groups.
func SplitGroup(ids []peer.ID, self peer.ID, size int) (group []peer.ID, index int) {
	at := slices.Index(ids, self)
	if at < 0 {
		return nil, -1
	}
	size = max(size, 1)
	k := (len(ids) + size - 1) / size
	// Group g holds ids[g*n/k : (g+1)*n/k].
	n := len(ids)
	lo, hi := 0, n
	for g := range k {
		if (g+1)*n/k > at {
			lo, hi = g*n/k, (g+1)*n/k
			break
		}
	}
	return ids[lo:hi], at - lo
}

// declaration is what a peer stores in the DHT: how to reach it, its round
// counter and the signature of the model it trains (peers of one run with
// another signature are not grouped with it).
type declaration struct {
	Addr  peer.AddrInfo `json:"addr"`
	Round int           `json:"round"`
	Model string        `json:"model,omitempty"`
}

// maxModelSig bounds a declared model signature.
const maxModelSig = 256

func (d declaration) marshal() ([]byte, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("averaging: encode declaration: %w", err)
	}
	return b, nil
}

// parseDeclaration decodes and validates a declaration stored under subkey.
func parseDeclaration(subkey string, b []byte) (declaration, error) {
	var d declaration
	if len(b) > maxDeclaration {
		return d, fmt.Errorf("%w: declaration of %d bytes", ErrMessage, len(b))
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%w: declaration: %v", ErrMessage, err)
	}
	id, err := peer.Decode(subkey)
	switch {
	case err != nil:
		return d, fmt.Errorf("%w: declaration subkey: %v", ErrMessage, err)
	case d.Addr.ID != id:
		return d, fmt.Errorf("%w: declaration of %s under subkey %s", ErrMessage, d.Addr.ID, id)
	case len(d.Addr.Addrs) > maxDeclAddrs:
		return d, fmt.Errorf("%w: declaration with %d addresses", ErrMessage, len(d.Addr.Addrs))
	case d.Round < 0:
		return d, fmt.Errorf("%w: declaration at round %d", ErrMessage, d.Round)
	case len(d.Model) > maxModelSig:
		return d, fmt.Errorf("%w: model signature of %d bytes", ErrMessage, len(d.Model))
	}
	return d, nil
}

// declared returns the valid declarations under key, sorted by peer ID.
func declared(ctx context.Context, node *dht.Node, key string) ([]declaration, error) {
	items, err := node.Get(ctx, key)
	if err != nil && !errors.Is(err, dht.ErrNotFound) {
		return nil, fmt.Errorf("averaging: matchmaking get %q: %w", key, err)
	}
	now := time.Now()
	var ds []declaration
	for sub, it := range items {
		if it.Expiration.Before(now) {
			continue
		}
		d, err := parseDeclaration(sub, it.Value)
		if err != nil {
			continue // a bad record does not stop the round
		}
		ds = append(ds, d)
	}
	slices.SortFunc(ds, func(a, b declaration) int { return strings.Compare(string(a.Addr.ID), string(b.Addr.ID)) })
	return ds, nil
}

// PeerInfo is a peer of a run as listed in the DHT.
type PeerInfo struct {
	Addr  peer.AddrInfo
	Round int    // its round counter when it listed itself
	Model string // the signature of the model it trains
}

// FindPeers lists the peers of a run that declared themselves in the DHT
// recently (PeersKey), sorted by peer ID.
func FindPeers(ctx context.Context, node *dht.Node, run string) ([]PeerInfo, error) {
	ds, err := declared(ctx, node, PeersKey(run))
	if err != nil {
		return nil, err
	}
	out := make([]PeerInfo, len(ds))
	for i, d := range ds {
		out[i] = PeerInfo(d)
	}
	return out, nil
}

// MatchConfig configures a Matchmaker.
type MatchConfig struct {
	// Run names the run in DHT keys.
	Run string
	// Interval is the wall-clock length of a round (DefaultRoundInterval);
	// rounds are aligned to multiples of it.
	Interval time.Duration
	// Window is how long after a round starts the matchmaker waits for
	// declarations before reading the group (Interval/4).
	Window time.Duration
	// GroupSize is the most members of a group and the grid's side.
	GroupSize int
	// Dims is the number of grid dimensions (DefaultGridDims).
	Dims int
	// Model is this peer's model signature; declarations with another
	// are left out of its groups and counted in Formed.Mismatched.
	Model string
}

// Matchmaker forms a peer's group for a round through the DHT
// (Moshpit-style, no ranks). Its methods are called from one goroutine.
type Matchmaker struct {
	node     *dht.Node
	t        p2p.Transport
	run      string
	model    string
	interval time.Duration
	window   time.Duration
	size     int
	coords   []int
	rng      *rand.Rand
}

// NewMatchmaker returns a matchmaker of t's peer declaring in node.
func NewMatchmaker(node *dht.Node, t p2p.Transport, cfg MatchConfig) *Matchmaker {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultRoundInterval
	}
	if cfg.Window <= 0 || cfg.Window >= cfg.Interval {
		cfg.Window = cfg.Interval / 4
	}
	if cfg.Dims <= 0 {
		cfg.Dims = DefaultGridDims
	}
	run, interval, window, size, dims := cfg.Run, cfg.Interval, cfg.Window, max(cfg.GroupSize, 2), cfg.Dims
	// Start from random coordinates; the rounds rearrange them.
	h := fnv.New64a()
	h.Write([]byte(t.ID()))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(time.Now().UnixNano())))
	coords := make([]int, dims)
	for i := range coords {
		coords[i] = rng.IntN(size)
	}
	return &Matchmaker{node: node, t: t, run: run, model: cfg.Model, interval: interval, window: window, size: size, coords: coords, rng: rng}
}

// Interval is the length of a round.
func (m *Matchmaker) Interval() time.Duration { return m.interval }

// RoundAt is the wall-clock round of time t: rounds are aligned to
// multiples of the interval since the Unix epoch, so peers whose clocks
// agree to well within the window meet in the same round.
func (m *Matchmaker) RoundAt(t time.Time) int { return int(t.UnixNano() / int64(m.interval)) }

// Start is when round starts.
func (m *Matchmaker) Start(round int) time.Time { return time.Unix(0, int64(round)*int64(m.interval)) }

// Announce lists this peer under the run's peers key for late joiners,
// with its round counter, for three rounds.
func (m *Matchmaker) Announce(ctx context.Context, round int) error {
	v, err := declaration{Addr: m.t.AddrInfo(), Round: round, Model: m.model}.marshal()
	if err != nil {
		return err
	}
	if _, err := m.node.Store(ctx, PeersKey(m.run), m.t.ID().String(), v, time.Now().Add(3*m.interval)); err != nil {
		return fmt.Errorf("averaging: announce: %w", err)
	}
	return nil
}

// Formed is the outcome of Matchmaker.Form.
type Formed struct {
	// Session is the group's all-reduce session (members sorted by ID).
	Session Session
	// Key is the DHT key the group met under.
	Key string
	// Mismatched lists declarations under the key whose model signature
	// differs from this peer's; they were left out of the group.
	Mismatched []PeerInfo
}

// Form declares this peer for round, waits for the window, and returns
// the session of its group (members sorted by ID, at most GroupSize of
// them). The session ID is the key and the group's index in the split, so
// peers whose member lists disagree meet in the same session and the
// all-reduce drops the disagreeing ones at once (member-list hash check).
func (m *Matchmaker) Form(ctx context.Context, round, stepRound int) (Formed, error) {
	key := GroupKey(m.run, round, m.coords)
	f := Formed{Key: key}
	v, err := declaration{Addr: m.t.AddrInfo(), Round: stepRound, Model: m.model}.marshal()
	if err != nil {
		return f, err
	}
	end := m.Start(round).Add(m.interval)
	if _, err := m.node.Store(ctx, key, m.t.ID().String(), v, end); err != nil {
		return f, fmt.Errorf("averaging: matchmaking declare %q: %w", key, err)
	}
	if err := clock.SleepUntil(ctx, m.Start(round).Add(m.window)); err != nil {
		return f, err
	}
	// Read until two consecutive reads agree (at most three), so that
	// declarations still propagating when the window closed are seen by
	// everyone.
	var ds []declaration
	for try := range 3 {
		next, err := declared(ctx, m.node, key)
		if err != nil {
			return f, err
		}
		if try > 0 && sameMembers(ds, next) {
			break
		}
		ds = next
		if try < 2 {
			if err := clock.Sleep(ctx, m.window/8); err != nil {
				return f, err
			}
		}
	}
	ids := make([]peer.ID, 0, len(ds)+1)
	addrs := map[peer.ID]peer.AddrInfo{m.t.ID(): m.t.AddrInfo()}
	for _, d := range ds {
		if d.Model != m.model {
			if d.Addr.ID != m.t.ID() {
				f.Mismatched = append(f.Mismatched, PeerInfo(d))
			}
			continue
		}
		ids = append(ids, d.Addr.ID)
		addrs[d.Addr.ID] = d.Addr
	}
	if !slices.Contains(ids, m.t.ID()) {
		ids = append(ids, m.t.ID())
		slices.Sort(ids)
	}
	// Cut the groups from an order that changes every round but is the
	// same on every peer: cut from the ID order, the same peers would pair
	// up round after round once the coordinates collapse, and the swarm
	// could split into parts that never mix (seen: 8 peers in two halves).
	permute(ids, key)
	group, index := SplitGroup(ids, m.t.ID(), m.size)
	g := slices.Index(ids, group[0])
	ms := make([]Member, len(group))
	for i, id := range group {
		ms[i] = Member{Peer: addrs[id], Weight: 1}
	}
	// The next round averages along the next dimension; taking our index
	// in this group as the coordinate of this one spreads this group's
	// members over different groups from now on.
	m.coords[round%len(m.coords)] = index % m.size
	if len(group) == 1 {
		// Nobody shares our other coordinates: move to a random cell so
		// that a peer stranded in an empty row meets others later.
		for i := range m.coords {
			m.coords[i] = m.rng.IntN(m.size)
		}
	}
	id := key + "/" + strconv.Itoa(g)
	if len(id) > MaxSessionLen {
		h := fnv.New64a()
		h.Write([]byte(id))
		id = fmt.Sprintf("mm/%x", h.Sum64())
	}
	f.Session = Session{ID: id, Members: ms}
	return f, nil
}

func sameMembers(a, b []declaration) bool {
	return slices.EqualFunc(a, b, func(x, y declaration) bool { return x.Addr.ID == y.Addr.ID })
}
