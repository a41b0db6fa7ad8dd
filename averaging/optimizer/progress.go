package optimizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/dht"
)

// ProgressKey is the DHT key under which the peers of a run publish their
// progress (subkey: peer ID).
func ProgressKey(run string) string { return run + "/progress" }

// Record is one peer's progress as published in the DHT.
type Record struct {
	// Epoch is the swarm epoch the peer is in; Samples the samples it
	// processed in that epoch.
	Epoch   int   `json:"epoch"`
	Samples int64 `json:"samples"`
	// SamplesPerSecond is its recent throughput.
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Round and Steps are its averaging round counter and local steps.
	Round int `json:"round"`
	Steps int `json:"steps"`
}

// maxRecord bounds a progress record read from the DHT.
const maxRecord = 1 << 10

// ParseRecord decodes and validates a progress record.
func ParseRecord(b []byte) (Record, error) {
	var r Record
	if len(b) > maxRecord {
		return r, fmt.Errorf("progress record of %d bytes", len(b))
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("progress record: %w", err)
	}
	if r.Epoch < 0 || r.Samples < 0 || r.Round < 0 || r.Steps < 0 || r.SamplesPerSecond < 0 ||
		math.IsInf(r.SamplesPerSecond, 0) || math.IsNaN(r.SamplesPerSecond) || r.SamplesPerSecond > 1e12 {
		return r, fmt.Errorf("progress record out of range: %+v", r)
	}
	return r, nil
}

// Progress is the swarm's progress as one peer sees it.
type Progress struct {
	// Peers counts the peers with a fresh record, this one included.
	Peers int `json:"peers"`
	// SamplesPerSecond sums their throughput.
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Epoch is the swarm epoch; EpochSamples the samples counted in it so
	// far, out of TargetBatchSize.
	Epoch           int   `json:"epoch"`
	EpochSamples    int64 `json:"epoch_samples"`
	TargetBatchSize int64 `json:"target_batch_size"`
}

// Aggregate combines this peer's record with the others' (hivemind-style
// epochs): the swarm is in the highest epoch any peer reports, but at most
// one ahead of self (a peer cannot drag the others far forward); the
// samples of the peers in that epoch add up, and once they reach target
// (if positive) the epoch advances.
func Aggregate(self Record, others []Record, target int64) Progress {
	p := Progress{Peers: 1 + len(others), TargetBatchSize: target, Epoch: self.Epoch}
	p.SamplesPerSecond = self.SamplesPerSecond
	for _, r := range others {
		p.SamplesPerSecond += r.SamplesPerSecond
		p.Epoch = max(p.Epoch, min(r.Epoch, self.Epoch+1))
	}
	for _, r := range append(others, self) {
		if r.Epoch == p.Epoch {
			p.EpochSamples += r.Samples
		}
	}
	if target > 0 && p.EpochSamples >= target {
		p.Epoch++
		p.EpochSamples = 0
	}
	return p
}

// progressTracker is this peer's side of the epochs (swarmProgress guards
// it).
type progressTracker struct {
	target   int64
	epoch    int
	samples  int64 // in this epoch
	total    int64
	rate     float64
	lastT    time.Time
	lastN    int64
	swarm    Progress
	hasSwarm bool
}

func (p *progressTracker) add(samples int64) {
	p.samples += samples
	p.total += samples
}

// record returns this peer's record, updating its throughput.
func (p *progressTracker) record(now time.Time, round, steps int) Record {
	if !p.lastT.IsZero() {
		if dt := now.Sub(p.lastT).Seconds(); dt > 0 {
			p.rate = float64(p.total-p.lastN) / dt
		}
	}
	p.lastT, p.lastN = now, p.total
	return Record{Epoch: p.epoch, Samples: p.samples, SamplesPerSecond: p.rate, Round: round, Steps: steps}
}

// update adopts the swarm's view; entering a new epoch restarts the count.
func (p *progressTracker) update(sw Progress) {
	if sw.Epoch > p.epoch {
		p.epoch, p.samples = sw.Epoch, 0
	}
	p.swarm, p.hasSwarm = sw, true
}

// swarmProgress is this peer's side of the swarm's progress, under its
// own lock (taken after the Optimizer's, never before): the tracker, and
// the loop that publishes it.
type swarmProgress struct {
	mu      sync.Mutex
	tracker progressTracker
}

// add counts samples processed.
func (sp *swarmProgress) add(samples int64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.tracker.add(samples)
}

// epoch returns the swarm epoch this peer is in.
func (sp *swarmProgress) epoch() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.tracker.epoch
}

// setEpoch makes e the epoch this peer is in (a loaded state's).
func (sp *swarmProgress) setEpoch(e int) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.tracker.epoch = e
}

// view returns the swarm's progress as last read from the DHT, or this
// peer's counts before the first read.
func (sp *swarmProgress) view() Progress {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	p := &sp.tracker
	if p.hasSwarm {
		return p.swarm
	}
	return Progress{Peers: 1, Epoch: p.epoch, EpochSamples: p.samples, SamplesPerSecond: p.rate, TargetBatchSize: p.target}
}

// progressPublisher is where and how often a peer publishes its progress.
type progressPublisher struct {
	node  *dht.Node
	key   string // ProgressKey of the run
	self  peer.ID
	every time.Duration
	// counters returns the peer's round counter and local steps; failed
	// counts a failed publication or read.
	counters func() (round, steps int)
	failed   func()
}

// Progress returns the swarm's progress as last read from the DHT (only
// this peer's counts before the first read, or without a DHT).
func (o *Optimizer) Progress() Progress { return o.prog.view() }

// run publishes this peer's record and reads the others' every pub.every
// until ctx ends.
func (sp *swarmProgress) run(ctx context.Context, pub progressPublisher) {
	for ctx.Err() == nil {
		if err := sp.sync(ctx, pub); err != nil && ctx.Err() == nil {
			pub.failed()
		}
		if clock.Sleep(ctx, pub.every) != nil {
			return
		}
	}
}

// sync publishes this peer's record once and adopts the swarm's view.
func (sp *swarmProgress) sync(ctx context.Context, pub progressPublisher) error {
	ctx, cancel := context.WithTimeout(ctx, pub.every)
	defer cancel()
	round, steps := pub.counters()
	sp.mu.Lock()
	self := sp.tracker.record(time.Now(), round, steps)
	sp.mu.Unlock()
	b, err := json.Marshal(self)
	if err != nil {
		return err
	}
	if _, err := pub.node.Store(ctx, pub.key, pub.self.String(), b, time.Now().Add(3*pub.every)); err != nil {
		return fmt.Errorf("averaging: publish progress: %w", err)
	}
	items, err := pub.node.Get(ctx, pub.key)
	if err != nil && !errors.Is(err, dht.ErrNotFound) {
		return fmt.Errorf("averaging: read progress: %w", err)
	}
	now := time.Now()
	var others []Record
	for sub, it := range items {
		id, err := peer.Decode(sub)
		if err != nil || id == pub.self || it.Expiration.Before(now) {
			continue
		}
		if r, err := ParseRecord(it.Value); err == nil {
			others = append(others, r)
		}
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	// Count samples made since the record was built, too.
	self.Samples = sp.tracker.samples
	sp.tracker.update(Aggregate(self, others, sp.tracker.target))
	return nil
}
