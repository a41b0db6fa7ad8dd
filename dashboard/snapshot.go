package dashboard

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/metrics"
)

// The pure core: history keeps what successive polls saw, build turns it
// and the latest records into the Snapshot the page draws.

// Snapshot is the swarm as the page shows it, in JSON.
type Snapshot struct {
	// Time is when the records were read, Polls how many polls the
	// dashboard made, Error the last poll's error ("" if it worked) and
	// Dropped how many records that poll left out as invalid, forged or
	// expired.
	Time    time.Time `json:"time"`
	Polls   int       `json:"polls"`
	Error   string    `json:"error,omitempty"`
	Dropped int       `json:"dropped"`

	Peers       []Peer         `json:"peers"`
	Regions     []Region       `json:"regions"`
	Links       []Link         `json:"links"`
	RegionLinks []RegionLink   `json:"region_links"`
	Grids       []Grid         `json:"grids"`
	Pipelines   []Pipeline     `json:"pipelines"`
	Runs        []AveragingRun `json:"runs"`
	// Series are the peers' curves: the whole history in a full
	// snapshot, the points since the previous poll in an update (Append).
	Series []Series `json:"series"`
	Append bool     `json:"append,omitempty"`
}

// Peer is one status record with how old it is.
type Peer struct {
	metrics.Status
	Short      string  `json:"short"`
	Alive      bool    `json:"alive"`
	AgeSeconds float64 `json:"age_seconds"`
}

// Region lists the peers of one region ("" for peers that name none).
type Region struct {
	Name  string   `json:"name"`
	Peers []string `json:"peers"`
	Alive int      `json:"alive"`
}

// Link is a connection between two peers that both publish records, with
// its round-trip time (the mean of what each side reports).
type Link struct {
	A     string  `json:"a"`
	B     string  `json:"b"`
	RTTMs float64 `json:"rtt_ms"`
}

// RegionLink is the median round-trip time of the links between two
// regions (A <= B; A == B within a region).
type RegionLink struct {
	A     string  `json:"a"`
	B     string  `json:"b"`
	RTTMs float64 `json:"rtt_ms"`
	Links int     `json:"links"`
}

// Grid is one expert grid: the experts whose UIDs share a prefix, placed
// by their first index (row) and the rest (column).
type Grid struct {
	Prefix string   `json:"prefix"`
	Rows   int      `json:"rows"`
	Cols   int      `json:"cols"`
	Cells  []Expert `json:"cells"`
	// MaxLoad is the busiest expert's calls per second, for the colour
	// scale.
	MaxLoad float64 `json:"max_load"`
}

// Expert is one expert cell: its servers' counters summed.
type Expert struct {
	UID string `json:"uid"`
	Row int    `json:"row"`
	Col int    `json:"col"`
	// Load is calls per second between the last two records of its
	// servers, Calls the total since they started.
	Load    float64  `json:"load"`
	Calls   int64    `json:"calls"`
	Errors  int64    `json:"errors,omitempty"`
	Servers []string `json:"servers"`
	Alive   bool     `json:"alive"`
}

// Pipeline is a coordinator's plan and last iteration.
type Pipeline struct {
	Peer   string `json:"peer"`
	Short  string `json:"short"`
	Alive  bool   `json:"alive"`
	Region string `json:"region,omitempty"`
	metrics.PipelineStatus
}

// AveragingRun is the averaging peers of one run.
type AveragingRun struct {
	Run      string          `json:"run"`
	Algo     string          `json:"algo,omitempty"`
	MaxRound int64           `json:"max_round"`
	Peers    []AveragingPeer `json:"peers"`
}

// AveragingPeer is one averaging peer's rounds and groups.
type AveragingPeer struct {
	Peer  string `json:"peer"`
	Short string `json:"short"`
	Alive bool   `json:"alive"`
	Step  int64  `json:"step"`
	metrics.AveragingStatus
	// MeanGroup is the mean size of the groups it averaged in (0 if
	// unknown).
	MeanGroup float64 `json:"mean_group"`
}

// Series is one peer's curve points, oldest first.
type Series struct {
	Peer   string  `json:"peer"`
	Short  string  `json:"short"`
	Role   string  `json:"role"`
	Points []Point `json:"points"`
}

// Point is one record's numbers; T is the record's time in Unix
// milliseconds.
type Point struct {
	T        int64    `json:"t"`
	Step     int64    `json:"step"`
	Loss     *float64 `json:"loss,omitempty"`
	Accuracy *float64 `json:"accuracy,omitempty"`
	Rate     float64  `json:"rate"`
}

// history keeps the records' points per peer, bounded, and what is needed
// to turn counters into rates. It is not safe for concurrent use.
type history struct {
	max      int           // points per peer
	maxPeers int           // peers tracked
	forget   time.Duration // drop peers not seen for this long
	peers    map[string]*track
}

// track is one peer's history.
type track struct {
	last   metrics.Status
	points []Point
	added  int // points appended by the latest add
	// prevCalls and prevTime are the expert counters of the record
	// before last, load the rates computed from them.
	prevCalls map[string]int64
	prevTime  time.Time
	load      map[string]float64
}

func newHistory(maxPoints, maxPeers int, forget time.Duration) *history {
	return &history{max: maxPoints, maxPeers: maxPeers, forget: forget, peers: make(map[string]*track)}
}

// add takes one poll's records at now: a point for each record newer than
// the peer's last, expert rates, and forgetting peers long gone (and the
// least recently seen beyond maxPeers).
func (h *history) add(now time.Time, ss []metrics.Status) {
	for _, tr := range h.peers {
		tr.added = 0
	}
	for _, s := range ss {
		tr := h.peers[s.Peer]
		if tr == nil {
			tr = &track{}
			h.peers[s.Peer] = tr
		}
		if !tr.last.Time.IsZero() && !s.Time.After(tr.last.Time) {
			continue // the same record again
		}
		if s.Experts != nil {
			calls := make(map[string]int64, len(s.Experts.Loads))
			load := make(map[string]float64, len(s.Experts.Loads))
			dt := s.Time.Sub(tr.prevTime).Seconds()
			for _, l := range s.Experts.Loads {
				calls[l.UID] = l.Calls
				if prev, ok := tr.prevCalls[l.UID]; ok && dt > 0 && l.Calls >= prev {
					load[l.UID] = float64(l.Calls-prev) / dt
				}
			}
			tr.prevCalls, tr.prevTime, tr.load = calls, s.Time, load
		}
		tr.last = s
		tr.points = append(tr.points, Point{T: s.Time.UnixMilli(), Step: s.Step, Loss: s.Loss, Accuracy: s.Accuracy, Rate: s.SamplesPerSecond})
		if len(tr.points) > h.max {
			tr.points = slices.Delete(tr.points, 0, len(tr.points)-h.max)
		}
		tr.added = 1
	}
	for id, tr := range h.peers {
		if now.Sub(tr.last.Time) > h.forget {
			delete(h.peers, id)
		}
	}
	if over := len(h.peers) - h.maxPeers; over > 0 {
		ids := make([]string, 0, len(h.peers))
		for id := range h.peers {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b string) int { return h.peers[a].last.Time.Compare(h.peers[b].last.Time) })
		for _, id := range ids[:over] {
			delete(h.peers, id)
		}
	}
}

// short is the end of a peer ID, as skyhive status prints it.
func short(id string) string {
	if len(id) > 12 {
		return id[len(id)-8:]
	}
	return id
}

// build makes the snapshot at now from the history: every peer it tracks
// (the records of the last poll and those of peers not seen since, until
// forgotten), with all their points or, for an update, the points the
// last add appended.
func (h *history) build(now time.Time, update bool) Snapshot {
	snap := Snapshot{Time: now, Append: update, Peers: []Peer{}, Regions: []Region{}, Links: []Link{}, RegionLinks: []RegionLink{},
		Grids: []Grid{}, Pipelines: []Pipeline{}, Runs: []AveragingRun{}, Series: []Series{}}
	ids := make([]string, 0, len(h.peers))
	for id := range h.peers {
		ids = append(ids, id)
	}
	statuses := make([]metrics.Status, 0, len(ids))
	for _, id := range ids {
		statuses = append(statuses, h.peers[id].last)
	}
	metrics.SortStatus(statuses)
	byID := make(map[string]*Peer, len(statuses))
	for _, s := range statuses {
		snap.Peers = append(snap.Peers, Peer{Status: s, Short: short(s.Peer), Alive: s.Alive(now), AgeSeconds: max(now.Sub(s.Time).Seconds(), 0)})
	}
	for i := range snap.Peers {
		byID[snap.Peers[i].Peer] = &snap.Peers[i]
	}
	snap.Regions = regions(snap.Peers)
	snap.Links, snap.RegionLinks = links(snap.Peers, byID)
	snap.Grids = h.grids(snap.Peers)
	for _, p := range snap.Peers {
		if p.Pipeline != nil {
			snap.Pipelines = append(snap.Pipelines, Pipeline{Peer: p.Peer, Short: p.Short, Alive: p.Alive, Region: p.Region, PipelineStatus: *p.Pipeline})
		}
	}
	snap.Runs = runs(snap.Peers)
	for _, p := range snap.Peers {
		tr := h.peers[p.Peer]
		pts := tr.points
		if update {
			pts = pts[len(pts)-tr.added:]
		}
		snap.Series = append(snap.Series, Series{Peer: p.Peer, Short: p.Short, Role: p.Role, Points: slices.Clone(pts)})
	}
	return snap
}

// regions groups the peers by region, named regions first.
func regions(peers []Peer) []Region {
	idx := map[string]int{}
	var out []Region
	for _, p := range peers {
		i, ok := idx[p.Region]
		if !ok {
			i = len(out)
			idx[p.Region] = i
			out = append(out, Region{Name: p.Region})
		}
		out[i].Peers = append(out[i].Peers, p.Peer)
		if p.Alive {
			out[i].Alive++
		}
	}
	slices.SortFunc(out, func(a, b Region) int {
		switch {
		case a.Name == b.Name:
			return 0
		case a.Name == "":
			return 1
		case b.Name == "":
			return -1
		}
		return strings.Compare(a.Name, b.Name)
	})
	if out == nil {
		out = []Region{}
	}
	return out
}

// links pairs the peers' links to other publishing peers, averaging the
// two directions, and summarizes them per pair of regions.
func links(peers []Peer, byID map[string]*Peer) ([]Link, []RegionLink) {
	type pair struct{ a, b string }
	sum := map[pair][2]float64{} // RTT sum, reports
	for _, p := range peers {
		for _, l := range p.Links {
			if byID[l.Peer] == nil || l.Peer == p.Peer {
				continue
			}
			k := pair{p.Peer, l.Peer}
			if k.b < k.a {
				k.a, k.b = k.b, k.a
			}
			v := sum[k]
			sum[k] = [2]float64{v[0] + l.RTTMs, v[1] + 1}
		}
	}
	out := make([]Link, 0, len(sum))
	perRegion := map[pair][]float64{}
	for k, v := range sum {
		rtt := v[0] / v[1]
		out = append(out, Link{A: k.a, B: k.b, RTTMs: rtt})
		ra, rb := byID[k.a].Region, byID[k.b].Region
		if rb < ra {
			ra, rb = rb, ra
		}
		perRegion[pair{ra, rb}] = append(perRegion[pair{ra, rb}], rtt)
	}
	slices.SortFunc(out, func(x, y Link) int { return cmp.Or(strings.Compare(x.A, y.A), strings.Compare(x.B, y.B)) })
	rl := make([]RegionLink, 0, len(perRegion))
	for k, rtts := range perRegion {
		slices.Sort(rtts)
		med := rtts[len(rtts)/2]
		if len(rtts)%2 == 0 {
			med = (rtts[len(rtts)/2-1] + rtts[len(rtts)/2]) / 2
		}
		rl = append(rl, RegionLink{A: k.a, B: k.b, RTTMs: med, Links: len(rtts)})
	}
	slices.SortFunc(rl, func(x, y RegionLink) int { return cmp.Or(strings.Compare(x.A, y.A), strings.Compare(x.B, y.B)) })
	return out, rl
}

// grids places the experts that servers report on their grids.
func (h *history) grids(peers []Peer) []Grid {
	type cell struct {
		Expert
		idx []int
	}
	cells := map[string]*cell{}
	for _, p := range peers {
		if p.Experts == nil {
			continue
		}
		tr := h.peers[p.Peer]
		for _, l := range p.Experts.Loads {
			c := cells[l.UID]
			if c == nil {
				c = &cell{Expert: Expert{UID: l.UID}, idx: uidIndex(l.UID)}
				cells[l.UID] = c
			}
			c.Calls += l.Calls
			c.Errors += l.Errors
			c.Load += tr.load[l.UID]
			c.Servers = append(c.Servers, p.Short)
			c.Alive = c.Alive || p.Alive
		}
	}
	byPrefix := map[string][]*cell{}
	for uid, c := range cells {
		prefix := uid
		if i := strings.IndexByte(uid, '.'); i >= 0 && c.idx != nil {
			prefix = uid[:i]
		}
		byPrefix[prefix] = append(byPrefix[prefix], c)
	}
	out := []Grid{}
	for prefix, cs := range byPrefix {
		g := Grid{Prefix: prefix}
		// Rows by the first index; columns by the rest, in order.
		cols := map[string]int{}
		var colKeys []string
		for _, c := range cs {
			k := fmtIdx(c.idx, 1)
			if _, ok := cols[k]; !ok {
				cols[k] = 0
				colKeys = append(colKeys, k)
			}
		}
		slices.SortFunc(colKeys, func(a, b string) int { return cmpIdx(parseIdx(a), parseIdx(b)) })
		for i, k := range colKeys {
			cols[k] = i
		}
		slices.SortFunc(cs, func(a, b *cell) int { return cmp.Or(cmpIdx(a.idx, b.idx), strings.Compare(a.UID, b.UID)) })
		rows := map[int]int{}
		for _, c := range cs {
			r := 0
			if len(c.idx) > 0 {
				r = c.idx[0]
			}
			if _, ok := rows[r]; !ok {
				rows[r] = len(rows)
			}
		}
		for _, c := range cs {
			r := 0
			if len(c.idx) > 0 {
				r = c.idx[0]
			}
			c.Row, c.Col = rows[r], cols[fmtIdx(c.idx, 1)]
			slices.Sort(c.Servers)
			g.Cells = append(g.Cells, c.Expert)
			g.MaxLoad = max(g.MaxLoad, c.Load)
		}
		g.Rows, g.Cols = len(rows), len(colKeys)
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Grid) int { return strings.Compare(a.Prefix, b.Prefix) })
	return out
}

// uidIndex returns the indices of a grid UID "prefix.i.j…" (nil if it is
// not one).
func uidIndex(uid string) []int {
	parts := strings.Split(uid, ".")
	if len(parts) < 2 {
		return nil
	}
	idx := make([]int, 0, len(parts)-1)
	for _, p := range parts[1:] {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil
		}
		idx = append(idx, n)
	}
	return idx
}

func fmtIdx(idx []int, from int) string {
	var b strings.Builder
	for i := from; i < len(idx); i++ {
		if i > from {
			b.WriteByte('.')
		}
		b.WriteString(strconv.Itoa(idx[i]))
	}
	return b.String()
}

func parseIdx(s string) []int {
	if s == "" {
		return nil
	}
	return uidIndex("x." + s)
}

func cmpIdx(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if c := cmp.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// runs groups the averaging peers by run.
func runs(peers []Peer) []AveragingRun {
	idx := map[string]int{}
	out := []AveragingRun{}
	for _, p := range peers {
		a := p.Averaging
		if a == nil {
			continue
		}
		i, ok := idx[a.Run]
		if !ok {
			i = len(out)
			idx[a.Run] = i
			out = append(out, AveragingRun{Run: a.Run, Algo: a.Algo})
		}
		ap := AveragingPeer{Peer: p.Peer, Short: p.Short, Alive: p.Alive, Step: p.Step, AveragingStatus: *a}
		if a.Groups > 0 && a.GroupMembers > 0 {
			ap.MeanGroup = float64(a.GroupMembers) / float64(a.Groups)
		}
		r := &out[i]
		r.Peers = append(r.Peers, ap)
		r.MaxRound = max(r.MaxRound, a.Round)
	}
	slices.SortFunc(out, func(a, b AveragingRun) int { return strings.Compare(a.Run, b.Run) })
	return out
}
