package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
)

// Storer stores a DHT record: a dht.Node, which signs a record whose
// subkey is its own peer ID.
type Storer interface {
	Store(ctx context.Context, key, subkey string, value []byte, expiration time.Time) (int, error)
}

// Getter reads a DHT key's dictionary: a dht.Node.
type Getter interface {
	Get(ctx context.Context, key string) (map[string]dht.Item, error)
}

// HostInfo is what a peer's network host says about it in its record.
type HostInfo struct {
	Addrs []string
	Reach string
	Links []Link
}

// DefaultStatusPeriod is how often a Publisher stores its record unless
// told otherwise.
const DefaultStatusPeriod = 15 * time.Second

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// DHT stores the record (required); it must sign with the key of
	// Peer, as a dht.Node on Peer's host does.
	DHT Storer
	// Peer is the publisher's peer ID (required), Role its role (one of
	// the Role constants), Region where it runs ("" if unknown), Version
	// its software (BuildVersion() if empty).
	Peer    string
	Role    string
	Region  string
	Version string
	// Period is how often the record is stored (DefaultStatusPeriod), TTL
	// how long each lasts (4 periods, at most dht.DefaultMaxTTL).
	Period time.Duration
	TTL    time.Duration
	// Host describes the peer's addresses, reachability and links (nil:
	// none); it may take a moment (e.g. to ping peers) but should respect
	// ctx.
	Host func(ctx context.Context) HostInfo
	// Sample fills in the role's numbers: step, samples, loss, accuracy
	// and the role-specific part (nil: none). Samples should count all
	// samples since the start: the publisher derives SamplesPerSecond
	// from it unless Sample sets it.
	Sample func(s *Status)
	// Clock is the publisher's time (nil: the wall clock).
	Clock clock.Clock
	// OnError is told of failed stores (nil: they are dropped; the next
	// period tries again).
	OnError func(error)
}

// Publisher stores a peer's status record in the DHT every period.
type Publisher struct {
	cfg     PublisherConfig
	clk     clock.Clock
	started time.Time

	mu   sync.Mutex
	rate rateMeter
	last Status
}

// NewPublisher checks cfg and returns a publisher; Run starts it.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Period == 0 {
		cfg.Period = DefaultStatusPeriod
	}
	if cfg.TTL == 0 {
		cfg.TTL = min(4*cfg.Period, dht.DefaultMaxTTL)
	}
	if cfg.Version == "" {
		cfg.Version = BuildVersion()
	}
	switch {
	case cfg.DHT == nil:
		return nil, errors.New("metrics: publisher needs a DHT")
	case !selfCertifying(cfg.Peer):
		return nil, fmt.Errorf("metrics: publisher peer %q is not a peer ID that embeds its key", cfg.Peer)
	case !KnownRole(cfg.Role):
		return nil, fmt.Errorf("metrics: unknown role %q", cfg.Role)
	case cfg.Period < MinStatusPeriod || cfg.Period > MaxStatusPeriod:
		return nil, fmt.Errorf("metrics: status period %v not in [%v, %v]", cfg.Period, MinStatusPeriod, MaxStatusPeriod)
	case cfg.TTL <= cfg.Period || cfg.TTL > dht.DefaultMaxTTL:
		return nil, fmt.Errorf("metrics: status TTL %v must exceed the period %v and be at most %v", cfg.TTL, cfg.Period, dht.DefaultMaxTTL)
	case checkText(cfg.Region, maxText) != nil:
		return nil, fmt.Errorf("metrics: region %q: at most %d printable bytes", cfg.Region, maxText)
	}
	clk := clock.Or(cfg.Clock)
	return &Publisher{cfg: cfg, clk: clk, started: clk.Now()}, nil
}

// Run stores the record now and then every period until ctx ends, and
// returns nil then. Failed stores are reported to OnError and retried at
// the next period.
func (p *Publisher) Run(ctx context.Context) error {
	for {
		if err := p.Publish(ctx); err != nil && ctx.Err() == nil && p.cfg.OnError != nil {
			p.cfg.OnError(err)
		}
		if err := p.clk.Sleep(ctx, p.cfg.Period); err != nil {
			return nil
		}
	}
}

// Publish makes the record and stores it once, within a period.
func (p *Publisher) Publish(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(p.cfg.Period, 5*time.Second))
	defer cancel()
	var hi HostInfo
	if p.cfg.Host != nil {
		hi = p.cfg.Host(ctx)
	}
	now := p.clk.Now()
	s := Status{Addrs: hi.Addrs, Reach: hi.Reach, Links: hi.Links}
	if p.cfg.Sample != nil {
		p.cfg.Sample(&s)
	}
	p.mu.Lock()
	s = p.make(s, now)
	p.mu.Unlock()
	b, err := Encode(s)
	if err != nil {
		return err
	}
	if _, err := p.cfg.DHT.Store(ctx, StatusKey, p.cfg.Peer, b, now.Add(p.cfg.TTL)); err != nil {
		return fmt.Errorf("metrics: store status: %w", err)
	}
	p.mu.Lock()
	p.last = s
	p.mu.Unlock()
	return nil
}

// make completes a sampled record at now: the publisher's identity and
// times, the throughput from the samples counted since the last record,
// and Sanitize. The caller holds p.mu.
func (p *Publisher) make(s Status, now time.Time) Status {
	s.Peer, s.Role, s.Region, s.Version = p.cfg.Peer, p.cfg.Role, p.cfg.Region, p.cfg.Version
	s.Started, s.Time, s.PeriodSeconds = p.started, now, p.cfg.Period.Seconds()
	if r := p.rate.update(now, s.Samples); s.SamplesPerSecond == 0 {
		s.SamplesPerSecond = r
	}
	s.Sanitize()
	return s
}

// Last returns the last record stored (zero before the first).
func (p *Publisher) Last() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// rateMeter turns a running count into a rate between updates.
type rateMeter struct {
	t    time.Time
	n    int64
	rate float64
}

// update records count n at now and returns the rate since the previous
// update; the previous rate if no time passed, 0 at first or when the
// count went back (a restart).
func (m *rateMeter) update(now time.Time, n int64) float64 {
	switch dt := now.Sub(m.t).Seconds(); {
	case m.t.IsZero() || n < m.n:
		m.rate = 0
	case dt > 0:
		m.rate = float64(n-m.n) / dt
	default:
		return m.rate
	}
	m.t, m.n = now, n
	return m.rate
}

// ReadStatus fetches the status records from the DHT and returns the
// valid ones at now (see ParseStatus) and how many it dropped. No records
// at all is not an error.
func ReadStatus(ctx context.Context, g Getter, now time.Time) ([]Status, int, error) {
	ss, dropped, _, err := readStatus(ctx, g, now)
	return ss, dropped, err
}

// statsGetter is a Getter that also describes its lookups (dht.Node).
type statsGetter interface {
	GetStats(ctx context.Context, key string) (map[string]dht.Item, dht.Stats, error)
}

// readStatus is ReadStatus that also says whether a replica's answer was
// near what one answer carries (dht.Stats.Crowded), when g can tell.
func readStatus(ctx context.Context, g Getter, now time.Time) ([]Status, int, bool, error) {
	var (
		items   map[string]dht.Item
		crowded bool
		err     error
	)
	if sg, ok := g.(statsGetter); ok {
		var st dht.Stats
		items, st, err = sg.GetStats(ctx, StatusKey)
		crowded = st.Crowded
	} else {
		items, err = g.Get(ctx, StatusKey)
	}
	if errors.Is(err, dht.ErrNotFound) {
		return nil, 0, crowded, nil
	}
	if err != nil {
		return nil, 0, crowded, fmt.Errorf("metrics: read status records: %w", err)
	}
	ss, dropped := ParseStatus(items, now)
	return ss, dropped, crowded, nil
}

// Live holds numbers a training loop updates for its status record and a
// Publisher's Sample reads. A nil *Live ignores updates. Safe for
// concurrent use.
type Live struct {
	mu sync.Mutex
	s  Status
}

// Update changes the numbers under the lock.
func (l *Live) Update(f func(s *Status)) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.s)
}

// Sample copies the numbers into s: step, samples, samples per second,
// loss, accuracy and the role-specific parts (which are shared: Update
// replaces them rather than changing them in place).
func (l *Live) Sample(s *Status) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.Step, s.Samples, s.SamplesPerSecond = l.s.Step, l.s.Samples, l.s.SamplesPerSecond
	s.Loss, s.Accuracy = l.s.Loss, l.s.Accuracy
	s.DHT, s.Averaging, s.Experts, s.Pipeline = l.s.DHT, l.s.Averaging, l.s.Experts, l.s.Pipeline
}
