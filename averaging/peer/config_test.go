package peer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/p2p"
)

// ConfigFrom applies a language model's defaults (the model's warm-up
// and clipping, the context and corpus bound of skyhive train) and keeps
// the negative fields' meaning (the flag's 0).
func TestConfigFromLanguageModel(t *testing.T) {
	c, err := ConfigFrom(launch.Peer{Algo: "diloco", Model: "gpt-mini", Data: "gcide", InnerSteps: 10, OuterLR: 0.7, Clip: -1, Codec: "none"})
	if err != nil {
		t.Fatal(err)
	}
	d := models.DefaultsOf("gpt-mini")
	if c.Algo != optimizer.DiLoCo || c.Seq != DefaultSeq || c.CorpusBytes != DefaultCorpusBytes || c.Warmup != int(d.Warmup) ||
		c.ClipNorm != 0 || c.WeightDecay != DefaultWeightDecay || c.OuterMomentum != optimizer.NoMomentum {
		t.Errorf("%+v", c)
	}
	if c, err = ConfigFrom(launch.Peer{Algo: "wagma", Model: "gpt:2x32:300", Data: "gcide", InnerSteps: 1, OuterLR: 1, Codec: "none"}); err != nil || c.Seq != 0 {
		t.Errorf("a spec's context: seq %d, %v", c.Seq, err)
	}
}

// Bad values are errors that name the flag to fix.
func TestConfigFromNamesFlags(t *testing.T) {
	ok := launch.Peer{Algo: "wagma", Model: "mlp-small", InnerSteps: 1, OuterLR: 1, Codec: "none", Aggregation: "mean"}
	cases := []struct {
		edit func(*launch.Peer)
		want string
	}{
		{func(l *launch.Peer) { l.Algo = "gossip" }, "--algo"},
		{func(l *launch.Peer) { l.InnerSteps = 0 }, "--inner-steps"},
		{func(l *launch.Peer) { l.Matchmaking = "ring" }, "--matchmaking"},
		{func(l *launch.Peer) { l.Codec = "zip" }, "--codec"},
		{func(l *launch.Peer) { l.Aggregation = "median" }, "--aggregation"},
		{func(l *launch.Peer) { l.Shard = "3/2" }, "--shard"},
		{func(l *launch.Peer) { l.Data = "gcide" }, "image classifier"},
		{func(l *launch.Peer) { l.Model, l.Data = "gpt-mini", "fashion-mnist" }, "--data"},
	}
	if _, err := ConfigFrom(ok); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		l := ok
		c.edit(&l)
		if _, err := ConfigFrom(l); !errors.Is(err, ErrConfig) || !strings.Contains(asFlags(err), c.want) {
			t.Errorf("%+v: got %v, want %q", l, err, c.want)
		}
	}
}

// A local run that cannot start is refused before anything starts,
// naming the flag.
func TestLocalRunCheck(t *testing.T) {
	ok := LocalRun{Exe: "skyhive", Peers: 2, SlowdownMin: 1, SlowdownMax: 2,
		Peer: launch.Peer{Algo: "wagma", InnerSteps: 1, OuterLR: 1, Steps: 10}}
	cases := []struct {
		edit func(*LocalRun)
		want string
	}{
		{func(r *LocalRun) { r.Peers = 0 }, "--peers"},
		{func(r *LocalRun) { r.Peers = MaxLocalPeers + 1 }, "--peers"},
		{func(r *LocalRun) { r.SlowdownMin = 3 }, "--slowdown-min"},
		{func(r *LocalRun) { r.Peer.Steps = 0 }, "--duration or a number of --steps"},
		{func(r *LocalRun) { r.Peer.Steps = -1 }, "must not be negative"},
		{func(r *LocalRun) { r.Peer.Limit = -1 }, "--limit"},
		{func(r *LocalRun) { r.Peer.Algo = "gossip" }, "--algo"},
		{func(r *LocalRun) { r.Peer.Fragments = 2 }, "--fragments"},
	}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		r := ok
		c.edit(&r)
		if err := r.Check(); !errors.Is(err, ErrConfig) || !strings.Contains(asFlags(err), c.want) {
			t.Errorf("%+v: got %v, want %q", r, err, c.want)
		}
	}
}

// asFlags is err's message as a command shows it: the options of a
// *launch.FieldError named as flags ("--inner-steps" for inner_steps).
func asFlags(err error) string {
	var fe *launch.FieldError
	if errors.As(err, &fe) {
		return fe.Renamed(func(f string) string { return "--" + strings.ReplaceAll(f, "_", "-") }).Error()
	}
	return fmt.Sprint(err)
}

// ToField writes an option so that ConfigFrom reads it back: 0 (none)
// stays 0 instead of taking the default, other values stay themselves.
func TestToFieldRoundTrip(t *testing.T) {
	c, err := ConfigFrom(launch.Peer{Algo: "wagma", Model: "gpt-mini", Data: "gcide", InnerSteps: 1, OuterLR: 0.7, Codec: "none",
		Clip: ToField(0), Warmup: int(ToField(0)), WeightDecay: ToField(0.05), CorpusBytes: int64(ToField(4096))})
	if err != nil {
		t.Fatal(err)
	}
	if c.ClipNorm != 0 || c.Warmup != 0 || c.WeightDecay != 0.05 || c.CorpusBytes != 4096 {
		t.Fatalf("clip %v, warm-up %d, weight decay %v, corpus bytes %d; want 0, 0, 0.05, 4096", c.ClipNorm, c.Warmup, c.WeightDecay, c.CorpusBytes)
	}
}

// FromLaunch parses the DHT peers and bounds the records by an eighth of
// the memory budget, on the host it is given.
func TestFromLaunch(t *testing.T) {
	const seed = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd"
	l := launch.Peer{Net: launch.Net{DHT: []string{seed}, MemoryMiB: 128}, Algo: "wagma", InnerSteps: 1, OuterLR: 0.7, Codec: "none"}
	c, err := FromLaunch(l, p2p.Config{IdentityFile: "id.key"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.DHT) != 1 || c.DHT[0].ID.String() != seed[len(seed)-52:] || c.DHTMaxBytes != 16<<20 || c.Host.IdentityFile != "id.key" {
		t.Fatalf("got DHT %v, record bound %d, host %+v", c.DHT, c.DHTMaxBytes, c.Host)
	}
	l.DHT = []string{"not-an-address"}
	if _, err := FromLaunch(l, p2p.Config{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("a bad DHT address: %v", err)
	}
}
