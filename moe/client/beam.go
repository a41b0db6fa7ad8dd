package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
	suffixes []suffix
}

// suffix is one active next coordinate under a prefix key.
type suffix struct {
	coord int
	info  moe.ExpertInfo
	// full reports that info.UID is the prefix key followed by coord,
	// i.e. an expert rather than a longer prefix.
	full bool
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

// fetch returns the active next coordinates under each prefix key, from
// the cache or the DHT. A failed lookup counts as no active experts.
func (b *BeamSearch) fetch(ctx context.Context, keys []string) map[string][]suffix {
	out := make(map[string][]suffix, len(keys))
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

// parseSuffixes turns the subkeys of a prefix record into coordinates in
// increasing order, dropping anything malformed.
func parseSuffixes(key string, items map[string]dht.Item) []suffix {
	var out []suffix
	for sub, it := range items {
		c, err := strconv.Atoi(sub)
		if err != nil || c < 0 || strconv.Itoa(c) != sub {
			continue
		}
		info, err := moe.UnmarshalInfo(it.Value)
		if err != nil || len(info.UID) <= len(key) || info.UID[:len(key)] != key {
			continue
		}
		out = append(out, suffix{coord: c, info: info, full: info.UID == key+sub})
	}
	slices.SortFunc(out, func(a, b suffix) int { return cmp.Compare(a.coord, b.coord) })
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

// extension is a beam extended by one coordinate, before it is kept.
type extension struct {
	parent int // index in the sample's beams
	sfx    *suffix
	score  float32
}

// FindBest returns, for every sample, up to k experts with the highest
// scores, best first; equal scores go to the smaller coordinates, so the
// result does not depend on map order. scores[d] holds sample i's scores
// for dimension d at [i*size_d : (i+1)*size_d]. Experts for which skip
// returns true are left out (skip may be nil).
func (b *BeamSearch) FindBest(ctx context.Context, n int, scores [][]float32, k int, skip func(uid string) bool) [][]Candidate {
	dims := b.grid.Size
	beams := make([][]beam, n)
	for i := range beams {
		beams[i] = []beam{{key: b.grid.Prefix + moe.Delimiter}}
	}
	var top []extension
	for d, size := range dims {
		seen := map[string]bool{}
		var keys []string
		for i := range beams {
			for _, bm := range beams[i] {
				if !seen[bm.key] {
					seen[bm.key] = true
					keys = append(keys, bm.key)
				}
			}
		}
		found := b.fetch(ctx, keys)
		last := d == len(dims)-1
		width := b.beamSize
		if last {
			width = max(k, b.beamSize)
		}
		for i := range beams {
			cur := beams[i]
			row := scores[d][i*size : (i+1)*size]
			// before orders extensions: higher score first, then smaller
			// coordinates.
			before := func(x, y extension) bool {
				if x.score != y.score {
					return x.score > y.score
				}
				if c := slices.Compare(cur[x.parent].coords, cur[y.parent].coords); c != 0 {
					return c < 0
				}
				return x.sfx.coord < y.sfx.coord
			}
			top = top[:0]
			for pi, bm := range cur {
				sfx := found[bm.key]
				for j := range sfx {
					s := &sfx[j]
					if s.coord >= size || (last && !s.full) {
						continue
					}
					e := extension{parent: pi, sfx: s, score: bm.score + row[s.coord]}
					if len(top) == width && !before(e, top[width-1]) {
						continue
					}
					if last && skip != nil && skip(s.info.UID) {
						continue
					}
					// Insert e in order, dropping the worst if full.
					at := len(top)
					for at > 0 && before(e, top[at-1]) {
						at--
					}
					if len(top) < width {
						top = append(top, extension{})
					}
					copy(top[at+1:], top[at:len(top)-1])
					top[at] = e
				}
			}
			next := make([]beam, len(top))
			for j, e := range top {
				p := cur[e.parent]
				coords := append(slices.Clip(p.coords), e.sfx.coord)
				next[j] = beam{coords: coords, score: e.score, info: e.sfx.info}
				if !last {
					next[j].key = p.key + strconv.Itoa(e.sfx.coord) + moe.Delimiter
				}
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

// Declared reads what the live experts of grid declare about themselves:
// one ExpertInfo for each active coordinate of the grid's first dimension
// (the record under the prefix key, e.g. "ffn."), in coordinate order,
// bypassing any cache. Each record was validated (moe.UnmarshalInfo); one
// from a server that does not declare its experts' type and hidden size
// has them empty. No record yields none and no error.
func Declared(ctx context.Context, d Getter, grid moe.Grid) ([]moe.ExpertInfo, error) {
	if err := grid.Validate(); err != nil {
		return nil, err
	}
	key := grid.Prefix + moe.Delimiter
	items, err := d.Get(ctx, key)
	if errors.Is(err, dht.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("moe/client: read %s: %w", key, err)
	}
	var out []moe.ExpertInfo
	for _, s := range parseSuffixes(key, items) {
		out = append(out, s.info)
	}
	return out, nil
}
