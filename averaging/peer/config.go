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
// errors wrap ErrConfig, and a *launch.FieldError where they are about
// options, named as launch.Peer's JSON fields (which a command renames to
// its flags). The network (Host, DHT, DHTMaxBytes), the writers, hooks and
// metrics are left to the caller.
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
		return c, optionErr(err, "%s", "algo")
	}
	if err := CheckOuter(l.Algo, c.InnerSteps, c.WarmupInnerSteps, c.Fragments, c.OverlapSteps, c.OuterLR); err != nil {
		return c, err
	}
	if c.OuterMomentum == 0 {
		c.OuterMomentum = optimizer.NoMomentum // the flag's 0 is no momentum; the optimizer's 0 is its default
	}
	if l.Matchmaking != "" {
		if c.Matchmaking, err = averaging.ParseMatchmaking(l.Matchmaking); err != nil {
			return c, optionErr(err, "%s", "matchmaking")
		}
	}
	if c.Codec, err = wire.ParseCodec(l.Codec); err != nil {
		return c, optionErr(err, "%s", "codec")
	}
	if c.Aggregation, err = averaging.ParseAggregation(l.Aggregation); err != nil {
		return c, optionErr(err, "%s", "aggregation")
	}
	if c.Shard, c.Shards, err = parseShard(l.Shard); err != nil {
		return c, err
	}
	return c, setData(&c, l)
}

// CheckOuter checks DiLoCo's outer optimization settings (inner_steps,
// warmup_inner_steps, fragments, overlap_steps and outer_lr) that the
// optimizer would refuse, for algorithm algo. The errors wrap ErrConfig
// and a *launch.FieldError naming the options.
func CheckOuter(algo string, innerSteps, warmupInnerSteps, fragments, overlapSteps int, outerLR float64) error {
	if innerSteps < 1 || !(outerLR > 0) || math.IsInf(outerLR, 0) {
		return optionErr(nil, fmt.Sprintf("%%s must be at least 1 and %%s positive (got %d and %v)", innerSteps, outerLR), "inner_steps", "outer_lr")
	}
	if warmupInnerSteps < 0 || warmupInnerSteps > innerSteps {
		return optionErr(nil, fmt.Sprintf("%%s must be 0 (no warm-up) to %%s (%d), got %d", innerSteps, warmupInnerSteps), "warmup_inner_steps", "inner_steps")
	}
	if fragments < 0 || fragments > innerSteps || overlapSteps < 0 || overlapSteps >= innerSteps {
		return optionErr(nil, fmt.Sprintf("%%s must be 0 to %%s (%d) and %%s 0 to %d, got %d and %d", innerSteps, innerSteps-1, fragments, overlapSteps), "fragments", "inner_steps", "overlap_steps")
	}
	if a, _ := optimizer.ParseAlgo(algo); (fragments > 1 || overlapSteps > 0) && (a != optimizer.DiLoCo || warmupInnerSteps > 0) {
		return optionErr(nil, fmt.Sprintf("%%s and %%s are for %%s diloco without %%s (got %%s %s, %%s %d)", algo, warmupInnerSteps),
			"fragments", "overlap_steps", "algo", "warmup_inner_steps", "algo", "warmup_inner_steps")
	}
	return nil
}

// parseShard parses a shard K/N ("": the whole set, 0 and 0).
func parseShard(s string) (k, n int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	ks, ns, ok := strings.Cut(s, "/")
	k, e1 := strconv.Atoi(ks)
	n, e2 := strconv.Atoi(ns)
	if !ok || e1 != nil || e2 != nil || n < 1 || k < 0 || k >= n {
		return 0, 0, optionErr(nil, fmt.Sprintf("%%s wants K/N with 0 <= K < N, got %q", s), "shard")
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
		return optionErr(nil, fmt.Sprintf("%s is a language model and fashion-mnist is images: train it on text (%%s %s)", l.Model, train.TextDataUsage), "data")
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

// optionErr is a configuration error about the peer's options fields (by
// their launch.Peer JSON names, which a command renames to its flags):
// text with a %s for each field, and its cause err (nil: none). It wraps
// ErrConfig and a *launch.FieldError.
func optionErr(err error, text string, fields ...string) error {
	return fmt.Errorf("%w: %w", ErrConfig, launch.NewFieldError(err, text, fields...))
}
