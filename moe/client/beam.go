package client

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
)

// Getter is what the beam search needs from the DHT; *dht.Node implements it.
type Getter interface {
	Get(ctx context.Context, key string) (map[string]dht.Item, error)
}

// Candidate is an expert found by the beam search with its coordinates on
// the grid and its gating score (the sum of the per-dimension scores).
type Candidate struct {
	Info   moe.ExpertInfo
	Coords []int
	Score  float32
}

// BeamSearch finds the best live experts of a grid, as hivemind's
// MoEBeamSearcher does: for each grid dimension it keeps the BeamSize
// prefixes with the highest scores and reads their active suffixes from the
// DHT prefix records that servers declare. Prefix lookups are cached for
// CacheTTL and shared by all samples of a batch. It is safe for concurrent
// use.
type BeamSearch struct {
	dht      Getter
	grid     moe.Grid
	beamSize int
	ttl      time.Duration
	parallel int

	mu    sync.Mutex
	cache map[string]cacheEntry
}

type cacheEntry struct {
	at       time.Time
	suffixes map[int]moe.ExpertInfo
}

// NewBeamSearch returns a beam search over grid. beamSize ≤ 0 selects 4;
// ttl ≤ 0 selects 10 s.
func NewBeamSearch(d Getter, grid moe.Grid, beamSize int, ttl time.Duration) (*BeamSearch, error) {
	if err := grid.Validate(); err != nil {
		return nil, err
	}
	if beamSize <= 0 {
		beamSize = 4
	}
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	return &BeamSearch{dht: d, grid: grid, beamSize: beamSize, ttl: ttl, parallel: 16, cache: map[string]cacheEntry{}}, nil
}

// Grid returns the searched grid.
func (b *BeamSearch) Grid() moe.Grid { return b.grid }

// suffixes returns the active next coordinates under prefix key, from the
// cache or the DHT. A failed lookup counts as no active experts.
func (b *BeamSearch) fetch(ctx context.Context, keys []string) map[string]map[int]moe.ExpertInfo {
	out := make(map[string]map[int]moe.ExpertInfo, len(keys))
	var missing []string
	now := time.Now()
	b.mu.Lock()
	for _, k := range keys {
		if e, ok := b.cache[k]; ok && now.Sub(e.at) < b.ttl {
			out[k] = e.suffixes
		} else {
			missing = append(missing, k)
		}
	}
	b.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, b.parallel)
	for _, k := range missing {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			items, err := b.dht.Get(ctx, k)
			if err != nil && !errors.Is(err, dht.ErrNotFound) {
				mu.Lock()
				out[k] = nil
				mu.Unlock()
				return // not cached: try again next time
			}
			sfx := parseSuffixes(k, items)
			mu.Lock()
			out[k] = sfx
			mu.Unlock()
			b.mu.Lock()
			b.cache[k] = cacheEntry{at: time.Now(), suffixes: sfx}
			b.mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// parseSuffixes turns the subkeys of a prefix record into coordinates,
// dropping anything malformed.
func parseSuffixes(key string, items map[string]dht.Item) map[int]moe.ExpertInfo {
	out := map[int]moe.ExpertInfo{}
	for sub, it := range items {
		c, err := strconv.Atoi(sub)
		if err != nil || c < 0 || strconv.Itoa(c) != sub {
			continue
		}
		info, err := moe.UnmarshalInfo(it.Value)
		if err != nil || len(info.UID) <= len(key) || info.UID[:len(key)] != key {
			continue
		}
		out[c] = info
	}
	return out
}

// Invalidate drops the cached prefix records, e.g. after many failures.
func (b *BeamSearch) Invalidate() {
	b.mu.Lock()
	clear(b.cache)
	b.mu.Unlock()
}

type beam struct {
	key    string
	coords []int
	score  float32
	info   moe.ExpertInfo
}

// FindBest returns, for every sample, up to k experts with the highest
// scores, best first. scores[d] holds sample i's scores for dimension d at
// [i*size_d : (i+1)*size_d]. Experts for which skip returns true are left
// out (skip may be nil).
func (b *BeamSearch) FindBest(ctx context.Context, n int, scores [][]float32, k int, skip func(uid string) bool) [][]Candidate {
	dims := b.grid.Size
	beams := make([][]beam, n)
	for i := range beams {
		beams[i] = []beam{{key: b.grid.Prefix + moe.Delimiter}}
	}
	for d, size := range dims {
		keys := map[string]bool{}
		for i := range beams {
			for _, bm := range beams[i] {
				keys[bm.key] = true
			}
		}
		found := b.fetch(ctx, slices.Collect(func(yield func(string) bool) {
			for k := range keys {
				if !yield(k) {
					return
				}
			}
		}))
		last := d == len(dims)-1
		width := b.beamSize
		if last {
			width = max(k, b.beamSize)
		}
		for i := range beams {
			var next []beam
			row := scores[d][i*size : (i+1)*size]
			for _, bm := range beams[i] {
				for c, info := range found[bm.key] {
					if c >= size {
						continue
					}
					coords := append(slices.Clone(bm.coords), c)
					nb := beam{key: bm.key + strconv.Itoa(c) + moe.Delimiter, coords: coords, score: bm.score + row[c], info: info}
					if last {
						if info.UID != moe.JoinUID(b.grid.Prefix, coords) || (skip != nil && skip(info.UID)) {
							continue
						}
					}
					next = append(next, nb)
				}
			}
			slices.SortFunc(next, func(a, b beam) int {
				if c := cmp.Compare(b.score, a.score); c != 0 {
					return c
				}
				return slices.Compare(a.coords, b.coords)
			})
			if len(next) > width {
				next = next[:width]
			}
			beams[i] = next
		}
	}
	out := make([][]Candidate, n)
	for i, bs := range beams {
		if len(bs) > k {
			bs = bs[:k]
		}
		for _, bm := range bs {
			out[i] = append(out[i], Candidate{Info: bm.info, Coords: bm.coords, Score: bm.score})
		}
	}
	return out
}
