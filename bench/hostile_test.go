package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestHostileQuick runs the hostile suite with tiny sizes and short
// phases: it must report, for the expert server, the averaging group and
// the DHT node (where IPv6 loopback exists),
// the honest throughput with its no-attack baseline and against the flood
// aimed at a decoy, and hostile requests that were sent and refused, none
// accepted.
func TestHostileQuick(t *testing.T) {
	c := hostileConfig{Hidden: 32, Batch: 8, MaxBatch: 64, Members: 3, VecLen: 4096,
		Identities: 2, MaxInflight: 16, Rate: 200, Rounds: 1, Phase: 400 * time.Millisecond, Settle: 100 * time.Millisecond}
	rs, err := runHostile(context.Background(), Options{Quick: true}, c)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Result{}
	for _, r := range rs {
		if r.Suite != "hostile" {
			t.Errorf("result of suite %q", r.Suite)
		}
		got[r.Case+" "+r.Metric] = r
	}
	for _, want := range []struct {
		prefix, metric string
		refuses        bool // the quick phases are long enough for refusals
		absorbs        bool // the victim may take some within its bounds
	}{
		{"expert-server/", "honest_samples_per_s", true, false},
		{"averaging-group/", "honest_allreduces_per_s", true, false},
		// A fresh key each round: the first request of each identity is
		// absorbed within its quota, and the quick phases send few more.
		{"dht/crowd-key", "honest_declarations_per_s", false, true},
		// Slow senders are cut after the victim's idle timeout, or
		// refused beyond 128 from one address: neither in 0.4 s at
		// 200/s.
		{"dht/slow-streams", "honest_declarations_per_s", false, false},
	} {
		var tput, decoy, refused, rate *Result
		for k, r := range got {
			if !strings.HasPrefix(k, want.prefix) {
				continue
			}
			switch r.Metric {
			case want.metric:
				if r.Baseline == "flood_at_decoy" {
					decoy = &r
				} else {
					tput = &r
				}
			case "hostile_refused":
				refused = &r
			case "hostile_rate":
				rate = &r
			}
		}
		if tput == nil || decoy == nil || refused == nil || rate == nil {
			t.Fatalf("%s: missing lines in %+v", want.prefix, rs)
		}
		if tput.Value <= 0 || tput.Baseline != "no_attack" || tput.BaselineValue <= 0 || tput.Ratio <= 0 {
			t.Errorf("%s throughput: %+v", want.prefix, *tput)
		}
		if decoy.Value != tput.Value || decoy.BaselineValue <= 0 || decoy.Ratio <= 0 {
			t.Errorf("%s throughput against the decoy flood: %+v", want.prefix, *decoy)
		}
		if (want.refuses && refused.Value < 1) || refused.BaselineValue < refused.Value || refused.Baseline != "hostile_sent" {
			t.Errorf("%s: no hostile request refused: %+v", want.prefix, *refused)
		}
		if strings.Contains(refused.Note, "ACCEPTED") || (!want.absorbs && !strings.Contains(refused.Note, ", 0 accepted")) {
			t.Errorf("%s: a hostile request was accepted: %s", want.prefix, refused.Note)
		}
		if rate.Value <= 0 || rate.BaselineValue <= 0 {
			t.Errorf("%s rate: %+v", want.prefix, *rate)
		}
	}
}
