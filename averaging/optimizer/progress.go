package optimizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// progressTracker is this peer's side of the epochs; guarded by o.mu.
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

// Progress returns the swarm's progress as last read from the DHT (only
// this peer's counts before the first read, or without a DHT).
func (o *Optimizer) Progress() Progress {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.progress.hasSwarm {
		return o.progress.swarm
	}
	return Progress{Peers: 1, Epoch: o.progress.epoch, EpochSamples: o.progress.samples,
		SamplesPerSecond: o.progress.rate, TargetBatchSize: o.progress.target}
}

// progressLoop publishes this peer's record and reads the others' every
// ProgressEvery.
func (o *Optimizer) progressLoop(ctx context.Context) {
	every := o.cfg.ProgressEvery
	for ctx.Err() == nil {
		if err := o.syncProgress(ctx, every); err != nil && ctx.Err() == nil {
			o.mu.Lock()
			o.stats.MatchErrors++
			o.mu.Unlock()
		}
		if clock.Sleep(ctx, every) != nil {
			return
		}
	}
}

func (o *Optimizer) syncProgress(ctx context.Context, every time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, every)
	defer cancel()
	o.mu.Lock()
	self := o.progress.record(time.Now(), o.round, o.stats.Steps)
	o.mu.Unlock()
	b, err := json.Marshal(self)
	if err != nil {
		return err
	}
	node, key, me := o.cfg.DHT, ProgressKey(o.cfg.RunID), o.avg.Transport().ID()
	if _, err := node.Store(ctx, key, me.String(), b, time.Now().Add(3*every)); err != nil {
		return fmt.Errorf("averaging: publish progress: %w", err)
	}
	items, err := node.Get(ctx, key)
	if err != nil && !errors.Is(err, dht.ErrNotFound) {
		return fmt.Errorf("averaging: read progress: %w", err)
	}
	now := time.Now()
	var others []Record
	for sub, it := range items {
		id, err := peer.Decode(sub)
		if err != nil || id == me || it.Expiration.Before(now) {
			continue
		}
		if r, err := ParseRecord(it.Value); err == nil {
			others = append(others, r)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// Count samples made since the record was built, too.
	self.Samples = o.progress.samples
	o.progress.update(Aggregate(self, others, o.progress.target))
	return nil
}
