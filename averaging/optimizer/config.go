package optimizer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/dht"
)

// Algo names a training algorithm that averages over the network.
type Algo string

// Algorithms an Optimizer runs.
const (
	// WAGMA is wait-avoiding group model averaging.
	WAGMA Algo = "wagma"
	// AllReduce is synchronous all-reduce SGD: every step, every peer
	// averages its gradients (or, with AverageModels, its model) with all
	// others and waits for them. Averaging gradients, it also averages
	// models every Period steps: replicas that took different steps when
	// an all-reduce failed (a member died or timed out) agree again.
	AllReduce Algo = "allreduce"
	// Local is local SGD: peers step alone and average their models with
	// all others every Period steps.
	Local Algo = "local"
	// DiLoCo is DiLoCo: InnerSteps steps of the wrapped optimizer alone,
	// then the pseudo-gradients θ_start − θ are averaged with every peer
	// and an outer SGD step with Nesterov momentum moves θ_start (see
	// diloco.go). The round counter counts outer steps.
	DiLoCo Algo = "diloco"
	// WADiLoCo is wait-avoiding DiLoCo: outer steps average the
	// pseudo-gradients in WAGMA's changing butterfly groups (in the
	// background, applied at the next Step), and every Tau outer steps a
	// synchronous global outer step over all peers bounds staleness.
	WADiLoCo Algo = "wa-diloco"
)

// ParseAlgo returns the algorithm named s.
func ParseAlgo(s string) (Algo, error) {
	var names []string
	for _, a := range algorithms() {
		if string(a.name) == s {
			return a.name, nil
		}
		names = append(names, string(a.name))
	}
	last := len(names) - 1
	return "", fmt.Errorf("unknown averaging algorithm %q (want %s or %s)", s, strings.Join(names[:last], ", "), names[last])
}

// ErrConfig wraps the errors New returns for a configuration it refuses.
var ErrConfig = errors.New("averaging: bad configuration")

// Defaults of Config.
const (
	DefaultTau          = 10
	DefaultPeriod       = 10
	DefaultMaxInflight  = 4
	DefaultMaxDownloads = 2
	// DefaultRunID is the run name of peers that give none; peers of one
	// run must agree on it.
	DefaultRunID = "skyhive"
)

// Config configures an Optimizer. Its fields are grouped by who reads
// them: every algorithm; matchmaking over a fixed roster or the DHT;
// all-reduce and local SGD; WAGMA; the DiLoCo family; joiners and
// progress. Each algorithm reads the fields of its own groups and
// ignores the rest.
type Config struct {
	// Algo is the algorithm (WAGMA by default).
	Algo Algo
	// RunID prefixes session IDs and DHT keys so that runs sharing peers
	// do not mix (DefaultRunID).
	RunID string
	// Model is the signature of the model trained ("" derives one from the
	// parameters' names and shapes); peers with another are not averaged
	// with and do not serve or receive state.
	Model string
	// Metrics, if set, receives the optimizer's Prometheus collector
	// (rounds, group sizes, bytes, stragglers dropped, staleness; see
	// docs/observability.md), unregistered by Close. Nil: no metrics.
	Metrics prometheus.Registerer

	// Matchmaking is how WAGMA finds its groups: averaging.MatchRanks
	// (butterfly groups over Roster, the default) or averaging.MatchDHT
	// (groups through DHT every RoundInterval, no ranks: Roster may be
	// empty and there is no global τ barrier; the grid rounds mix the
	// models instead).
	Matchmaking averaging.Matchmaking
	// Rank is this peer's index in Roster (MatchRanks).
	Rank int
	// Roster lists every peer by rank; Weight is its bandwidth share.
	Roster []averaging.Member
	// RoundWindow is how far from this peer's round counter an activation
	// may name a round (2·Tau+2): honest peers are never further apart, since
	// a global average every Tau rounds resets every counter. Activations
	// outside it, or from peers not in Roster, are refused and counted in
	// Stats.Refused.
	RoundWindow int
	// DHT is the node MatchDHT declares in, and where progress is
	// published (nil: no progress records).
	DHT *dht.Node
	// RoundInterval, MatchWindow and GridDims configure MatchDHT (see
	// averaging.MatchConfig).
	RoundInterval time.Duration
	MatchWindow   time.Duration
	GridDims      int

	// Period is local SGD's averaging period in steps, and all-reduce
	// SGD's model re-synchronization period (DefaultPeriod).
	Period int
	// AverageModels makes AllReduce average models after the optimizer
	// step instead of gradients before it.
	AverageModels bool

	// GroupSize is WAGMA's group size S (averaging.DefaultGroupSize of the
	// roster; at least 3 with MatchDHT). WA-DiLoCo's groups too.
	GroupSize int
	// Tau is WAGMA's staleness bound: a synchronous global average every
	// Tau rounds (DefaultTau). MatchRanks only. WA-DiLoCo's global outer
	// step every Tau outer steps too.
	Tau int
	// MaxInflight bounds the background group all-reduces at once
	// (DefaultMaxInflight); activations beyond it are declined, and the
	// group is told so at once (averaging.Averager.Decline) and goes on
	// without this peer. WA-DiLoCo, whose group outer steps run one after
	// the other, also declines while one of them waits to begin.
	MaxInflight int

	// InnerSteps is DiLoCo's H: steps of the wrapped optimizer between
	// outer steps (0: DefaultInnerSteps; negative is refused). DiLoCo and
	// WA-DiLoCo only, as are WarmupInnerSteps, OuterLR and OuterMomentum;
	// Fragments and OverlapSteps are DiLoCo's only.
	InnerSteps int
	// WarmupInnerSteps, if positive, is the H of the first outer step,
	// doubled at every outer step until it reaches InnerSteps. Replicas
	// that start from the same weights drift apart fastest in their first
	// steps, so an outer step after a whole H averages models that have
	// little in common; short first outer steps keep them together while
	// they do. 0: every outer step after InnerSteps; negative or above
	// InnerSteps is refused.
	WarmupInnerSteps int
	// OuterLR is the outer learning rate η (0: DefaultOuterLR; negative,
	// NaN or infinite is refused).
	OuterLR float64
	// OuterMomentum is the outer Nesterov momentum μ in [0, 1) (0:
	// DefaultOuterMomentum; NoMomentum: plain outer SGD; anything else
	// outside [0, 1) is refused).
	OuterMomentum float64
	// Fragments, if above 1, makes DiLoCo's outer steps Streaming
	// DiLoCo's: the parameters are cut into this many contiguous
	// fragments that take their outer steps in turn, one every
	// InnerSteps/Fragments inner steps (see streaming.go). At most
	// InnerSteps; DiLoCo without a warm-up only; 0 or 1: whole-model
	// outer steps.
	Fragments int
	// OverlapSteps is how many inner steps a (fragment's) outer step's
	// all-reduce may overlap before Step waits for it and applies it,
	// keeping the progress made meanwhile (0: Step waits at once, as
	// DiLoCo; below InnerSteps; DiLoCo without a warm-up only).
	OverlapSteps int

	// MaxDownloads bounds the state downloads this peer serves at once
	// (DefaultMaxDownloads); more are told the donor is busy.
	MaxDownloads int
	// TargetBatchSize is the number of samples, summed over the swarm, that
	// makes an epoch of the swarm's progress (0: epochs do not advance).
	TargetBatchSize int64
	// ProgressEvery is how often progress is published and read
	// (RoundInterval, or 2 s).
	ProgressEvery time.Duration
}

// complete checks c and fills in its defaults for a peer whose identity
// is self (the roster's entry at Rank under MatchRanks).
func (c *Config) complete(self peer.ID) error {
	if c.Algo == "" {
		c.Algo = WAGMA
	}
	if _, err := ParseAlgo(string(c.Algo)); err != nil {
		return err
	}
	mm, err := averaging.ParseMatchmaking(string(c.Matchmaking))
	if err != nil {
		return err
	}
	c.Matchmaking = mm
	p := len(c.Roster)
	if mm == averaging.MatchDHT {
		if c.Algo != WAGMA || c.DHT == nil {
			return errors.New("averaging: DHT matchmaking needs the wagma algorithm and a DHT node")
		}
		if c.RoundInterval <= 0 {
			c.RoundInterval = averaging.DefaultRoundInterval
		}
		if c.GroupSize == 0 {
			c.GroupSize = max(averaging.DefaultGroupSize(p), 3)
		}
	} else {
		if p == 0 || c.Rank < 0 || c.Rank >= p {
			return fmt.Errorf("averaging: rank %d of %d peers", c.Rank, p)
		}
		if c.Roster[c.Rank].Peer.ID != self {
			return fmt.Errorf("averaging: roster rank %d is %s, not this peer", c.Rank, c.Roster[c.Rank].Peer.ID)
		}
	}
	if c.GroupSize == 0 {
		// At least 2: a roster of one peer (training alone until others
		// come, or a benchmark) has no groups to form, but a valid size.
		c.GroupSize = max(averaging.DefaultGroupSize(p), 2)
	}
	if c.GroupSize < 2 {
		return fmt.Errorf("averaging: group size %d, want at least 2", c.GroupSize)
	}
	c.defaults()
	return nil
}

// defaults fills in the defaults of the fields that need no checks.
func (c *Config) defaults() {
	if c.Tau <= 0 {
		c.Tau = DefaultTau
	}
	if c.Period <= 0 {
		c.Period = DefaultPeriod
	}
	if c.RunID == "" {
		c.RunID = DefaultRunID
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.RoundWindow <= 0 {
		c.RoundWindow = 2*c.Tau + 2
	}
	if c.MaxDownloads <= 0 {
		c.MaxDownloads = DefaultMaxDownloads
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = c.RoundInterval
		if c.ProgressEvery <= 0 {
			c.ProgressEvery = 2 * time.Second
		}
	}
}
