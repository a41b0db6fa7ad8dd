package peer

import (
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
)

// Defaults returns the options of `skyhive peer` when none is given, which
// a config file's fields replace: an image classifier (mlp-small) that
// averages with WAGMA and publishes its status record, its batch and
// learning rate left 0 (the model's).
func Defaults() launch.Peer {
	return launch.Peer{
		Net:     launch.Net{HolePunching: true, AutoNAT: true, Reachability: "auto"},
		Process: launch.Process{StatusEvery: launch.Duration(metrics.DefaultStatusPeriod)},
		RunID:   optimizer.DefaultRunID, Algo: "wagma", Tau: optimizer.DefaultTau, Period: optimizer.DefaultPeriod,
		RoundInterval: launch.Duration(averaging.DefaultRoundInterval), InnerSteps: optimizer.DefaultInnerSteps,
		OuterLR: optimizer.DefaultOuterLR, OuterMomentum: optimizer.DefaultOuterMomentum,
		Codec: "none", Aggregation: "mean", MaxNormRatio: averaging.DefaultMaxNormRatio, MinAgree: 1,
		MinPeers: 2, WaitPeers: launch.Duration(time.Minute), JoinTimeout: launch.Duration(30 * time.Second),
		Model: "mlp-small", Seed: 1, Momentum: 0.9, DataDir: data.DefaultDir, Slowdown: 1,
		CheckpointEvery: launch.Duration(time.Minute), StatsEvery: launch.Duration(10 * time.Second),
	}
}
