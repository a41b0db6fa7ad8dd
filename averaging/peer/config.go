package peer

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/train"
	"github.com/skyhive/skyhive/wire"
)

// Defaults of a language-model peer's options that a launch.Peer leaves
// 0, the same as `skyhive train`'s; warm-up and clipping take the model's
// (models.DefaultsOf).
const (
	// DefaultSeq is the context of a model spec that gives none.
	DefaultSeq = 64
	// DefaultCorpusBytes bounds the text read for the tokenizer and the
	// training tokens.
	DefaultCorpusBytes = 2 << 20
	// DefaultWeightDecay is AdamW's decoupled weight decay.
	DefaultWeightDecay = 0.01
)

// ConfigFrom turns a peer's typed config (the flags of `skyhive peer`, or
// a config file of `skyhive @FILE`) into a Config: its averaging settings
// parsed and checked, its data checked against its model and, for a
// language model, its language-model options with their defaults. The
// errors wrap ErrConfig and name the options as the flags of `skyhive
// peer` (a config file's fields have their names with "_"). The network (Host, DHT, DHTMaxBytes), the
// writers, hooks and metrics are left to the caller.
func ConfigFrom(l launch.Peer) (Config, error) {
	c := Config{RunID: l.RunID, GroupSize: l.GroupSize, Tau: l.Tau, Period: l.Period,
		RoundInterval: time.Duration(l.RoundInterval), InnerSteps: l.InnerSteps, WarmupInnerSteps: l.WarmupInnerSteps,
		OuterLR: l.OuterLR, OuterMomentum: l.OuterMomentum, Fragments: l.Fragments, OverlapSteps: l.OverlapSteps,
		MaxNormRatio: l.MaxNormRatio, MinAgree: l.MinAgree, Timeout: time.Duration(l.Timeout),
		MinPeers: l.MinPeers, WaitPeers: time.Duration(l.WaitPeers), JoinTimeout: time.Duration(l.JoinTimeout),
		TargetBatchSize: l.TargetBatchSize, Model: l.Model, Seed: l.Seed, Batch: l.Batch, LR: l.LR, Momentum: l.Momentum,
		DataDir: l.DataDir, Limit: l.Limit, EvalExamples: l.EvalExamples, Steps: l.Steps, Duration: time.Duration(l.Duration),
		EvalEvery: time.Duration(l.EvalEvery), Slowdown: l.Slowdown, Checkpoint: l.Checkpoint,
		CheckpointEvery: time.Duration(l.CheckpointEvery), StatsEvery: time.Duration(l.StatsEvery)}
	var err error
	if c.Algo, err = optimizer.ParseAlgo(l.Algo); err != nil {
		return c, fmt.Errorf("%w: --algo: %w", ErrConfig, err)
	}
	if err := CheckOuter(l.Algo, c.InnerSteps, c.WarmupInnerSteps, c.Fragments, c.OverlapSteps, c.OuterLR); err != nil {
		return c, err
	}
	if c.OuterMomentum == 0 {
		c.OuterMomentum = optimizer.NoMomentum // the flag's 0 is no momentum; the optimizer's 0 is its default
	}
	if l.Matchmaking != "" {
		if c.Matchmaking, err = averaging.ParseMatchmaking(l.Matchmaking); err != nil {
			return c, fmt.Errorf("%w: --matchmaking: %w", ErrConfig, err)
		}
	}
	if c.Codec, err = wire.ParseCodec(l.Codec); err != nil {
		return c, fmt.Errorf("%w: --codec: %w", ErrConfig, err)
	}
	if c.Aggregation, err = averaging.ParseAggregation(l.Aggregation); err != nil {
		return c, fmt.Errorf("%w: --aggregation: %w", ErrConfig, err)
	}
	if c.Shard, c.Shards, err = parseShard(l.Shard); err != nil {
		return c, err
	}
	return c, setData(&c, l)
}

// CheckOuter checks DiLoCo's outer optimization settings (the flags
// --inner-steps, --warmup-inner-steps, --fragments, --overlap-steps and
// --outer-lr) that the optimizer would refuse, for algorithm algo. The
// errors wrap ErrConfig.
func CheckOuter(algo string, innerSteps, warmupInnerSteps, fragments, overlapSteps int, outerLR float64) error {
	if innerSteps < 1 || !(outerLR > 0) || math.IsInf(outerLR, 0) {
		return fmt.Errorf("%w: --inner-steps must be at least 1 and --outer-lr positive (got %d and %v)", ErrConfig, innerSteps, outerLR)
	}
	if warmupInnerSteps < 0 || warmupInnerSteps > innerSteps {
		return fmt.Errorf("%w: --warmup-inner-steps must be 0 (no warm-up) to --inner-steps (%d), got %d", ErrConfig, innerSteps, warmupInnerSteps)
	}
	if fragments < 0 || fragments > innerSteps || overlapSteps < 0 || overlapSteps >= innerSteps {
		return fmt.Errorf("%w: --fragments must be 0 to --inner-steps (%d) and --overlap-steps 0 to %d, got %d and %d", ErrConfig, innerSteps, innerSteps-1, fragments, overlapSteps)
	}
	if a, _ := optimizer.ParseAlgo(algo); (fragments > 1 || overlapSteps > 0) && (a != optimizer.DiLoCo || warmupInnerSteps > 0) {
		return fmt.Errorf("%w: --fragments and --overlap-steps are for --algo diloco without --warmup-inner-steps (got --algo %s, --warmup-inner-steps %d)", ErrConfig, algo, warmupInnerSteps)
	}
	return nil
}

// parseShard parses --shard K/N ("": the whole set, 0 and 0).
func parseShard(s string) (k, n int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	ks, ns, ok := strings.Cut(s, "/")
	k, e1 := strconv.Atoi(ks)
	n, e2 := strconv.Atoi(ns)
	if !ok || e1 != nil || e2 != nil || n < 1 || k < 0 || k >= n {
		return 0, 0, fmt.Errorf("%w: --shard wants K/N with 0 <= K < N, got %q", ErrConfig, s)
	}
	return k, n, nil
}

// setData checks a peer's data against its model and, for a language
// model, applies the language-model options, with their defaults where
// they are 0.
func setData(c *Config, l launch.Peer) error {
	if !train.IsLanguageModel(l.Model) {
		if l.Data != "" && l.Data != "fashion-mnist" {
			return fmt.Errorf("%w: %s is an image classifier: train it on fashion-mnist, not %s", ErrConfig, l.Model, l.Data)
		}
		return nil
	}
	if l.Data == "fashion-mnist" {
		return fmt.Errorf("%w: %s is a language model and fashion-mnist is images: train it on text (--data %s)", ErrConfig, l.Model, train.TextDataUsage)
	}
	c.Data, c.Seq, c.TokenWidth, c.EvalTokens, c.Vocab = l.Data, l.Seq, l.TokenWidth, l.EvalTokens, l.Vocab
	if c.Seq == 0 && !strings.Contains(l.Model, ":") {
		c.Seq = DefaultSeq // a spec with a context gives its own
	}
	d := models.DefaultsOf(l.Model)
	c.CorpusBytes = int64(fromField(float64(l.CorpusBytes), DefaultCorpusBytes))
	c.Warmup = int(fromField(float64(l.Warmup), float64(d.Warmup)))
	c.ClipNorm = fromField(l.Clip, d.ClipNorm)
	c.WeightDecay = fromField(l.WeightDecay, DefaultWeightDecay)
	c.lmDefaults()
	return nil
}

// ToField is an option's value as a launch.Peer field where 0 is the
// default (CorpusBytes, Warmup, Clip, WeightDecay): 0, which means none
// (no bound, no warm-up, no clipping, no decay), becomes negative.
func ToField(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// fromField is the value of a launch.Peer field where 0 is the default
// (def) and a negative value the flag's 0.
func fromField(v, def float64) float64 {
	if v == 0 {
		return def
	}
	return max(v, 0)
}
