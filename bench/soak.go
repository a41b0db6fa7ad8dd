package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/launch"
)

// soakSuite runs 8 `skyhive peer` processes with WAGMA for Duration (10
// minutes; 90 s with --quick) and checks that each one's resident memory
// and goroutine count stay flat after the warm-up (the first fifth of the
// run, at least 30 s). It is long, so `bench all` leaves it out.
func soakSuite() Suite {
	return Suite{Name: "soak", Short: "8 peer processes with WAGMA for 10 minutes: memory and goroutines flat after warm-up (not in 'all')", Run: runSoak}
}

// SoakPeers is the number of peer processes of the soak.
const SoakPeers = 8

// MinSoakDuration is the shortest soak AnalyzeSoak can judge: the warm-up
// (at least 30 s) and two measuring windows (each at least 30 s) after it.
const MinSoakDuration = 90 * time.Second

// CheckSoakDuration reports a soak too short to be judged, before it runs.
func CheckSoakDuration(d time.Duration) error {
	if d < MinSoakDuration {
		return fmt.Errorf("a soak of %v is too short (choose a longer duration): it measures after a 30 s warm-up over two windows of at least 30 s, so it needs at least %v", d, MinSoakDuration)
	}
	return nil
}

func runSoak(ctx context.Context, o Options) ([]Result, error) {
	d := o.Duration
	if d <= 0 {
		d = 10 * time.Minute
		if o.Quick {
			d = MinSoakDuration
		}
	}
	if err := CheckSoakDuration(d); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "skyhive-soak-")
	if err != nil {
		return nil, err
	}
	o.Logf("soak: %d peers for %v, logs and stats in %s", SoakPeers, d, dir)
	pc := launch.Peer{Algo: "wagma", Model: "mlp-small", Duration: launch.Duration(d), Quiet: true,
		StatsEvery: launch.Duration(10 * time.Second), EvalExamples: 2000}
	res, err := peer.Launch(ctx, peer.LaunchConfig{
		Exe: exe, Peers: SoakPeers, Peer: pc, Dir: dir, Duration: d, Log: o.Log,
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	return AnalyzeSoak(dir, SoakPeers, d, res)
}

// AnalyzeSoak reads the peers' stats files of a soak in dir and reports,
// for the worst peer, the growth of resident memory and of goroutines from
// the first window after the warm-up to the last window of the run (medians
// over each window, which span a tenth of the run and at least 30 s, so
// that garbage-collection and evaluation peaks do not count as growth), and
// the largest goroutine count seen after the warm-up.
func AnalyzeSoak(dir string, peers int, d time.Duration, res peer.Launched) ([]Result, error) {
	warm := max(d/5, 30*time.Second).Seconds()
	win := max(d/10, 30*time.Second).Seconds()
	c := fmt.Sprintf("%d peers, %v", peers, d)
	worstRSS, worstG := math.Inf(-1), math.Inf(-1) // signed: a peer may shrink
	var peakG, rss0, steps float64
	for i := range peers {
		snaps, err := peer.ReadSnapshots(peer.StatsFile(dir, i))
		if err != nil {
			return nil, fmt.Errorf("peer %d: %w (logs in %s)", i, err, dir)
		}
		var early, late, gEarly, gLate []float64
		end := 0.0
		for _, s := range snaps {
			if s.Final == nil {
				end = max(end, s.Seconds)
			}
		}
		for _, s := range snaps {
			switch {
			case s.Final != nil:
			case s.Seconds >= warm && s.Seconds < warm+win:
				early, gEarly = append(early, float64(s.RSSBytes)), append(gEarly, float64(s.Goroutines))
			case s.Seconds > end-win:
				late, gLate = append(late, float64(s.RSSBytes)), append(gLate, float64(s.Goroutines))
			}
			if s.Final == nil && s.Seconds >= warm {
				peakG = max(peakG, float64(s.Goroutines))
			}
		}
		if len(early) == 0 || len(late) == 0 || early[0] == 0 {
			return nil, fmt.Errorf("peer %d: too few stats after the %.0fs warm-up (logs in %s)", i, warm, filepath.Clean(dir))
		}
		e, l := Summarize(early).Median, Summarize(late).Median
		worstRSS = max(worstRSS, l/e-1)
		worstG = max(worstG, Summarize(gLate).Median-Summarize(gEarly).Median)
		rss0 += e / float64(peers)
		steps += float64(snaps[len(snaps)-1].Stats.Steps) / float64(peers)
	}
	return []Result{
		{Suite: "soak", Case: c, Metric: "rss_growth_max", Value: worstRSS, Unit: "fraction", Note: "worst peer, window medians after warm-up; target < 0.10"},
		{Suite: "soak", Case: c, Metric: "rss_after_warmup_mean", Value: rss0 / 1e6, Unit: "MB"},
		{Suite: "soak", Case: c, Metric: "goroutine_growth_max", Value: worstG, Unit: "goroutines", Note: "worst peer, window medians; target 0"},
		{Suite: "soak", Case: c, Metric: "goroutines_peak", Value: peakG, Unit: "goroutines"},
		{Suite: "soak", Case: c, Metric: "steps_per_peer", Value: steps, Unit: "steps"},
		{Suite: "soak", Case: c, Metric: "test_accuracy_mean", Value: res.MeanAccuracy, Unit: "fraction"},
	}, nil
}
