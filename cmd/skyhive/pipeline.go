package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/skyhive/skyhive/profile"
	"github.com/skyhive/skyhive/text"
	"github.com/skyhive/skyhive/train"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// pipelineFlags are the options of `skyhive train pipeline`.
type pipelineFlags struct {
	train           trainFlags
	workers         int
	slowdowns       string
	slowdownMax     float64
	memCaps         string
	joinWait        int
	net             connectFlags
	planFile        string
	strategy        string
	schedule        string
	micro           int
	replanThreshold float64
	checkpointEvery int
	iterTimeout     time.Duration
	logEvery        int
	killWorker      int
	killAt          int
	regions         string
	workerRegions   string
	coordRegion     string
	link            linkFlags
	compare         string
	compareRounds   int
	status          statusFlags
	// live receives the iterations for the status record.
	live *metrics.Live
}

func newTrainPipelineCmd() *cobra.Command {
	var p pipelineFlags
	cmd := &cobra.Command{
		Use:   "pipeline",
		Short: "Train a model as a load-balanced pipeline of stage workers (local processes or joined machines)",
		Long: "Coordinate a pipeline: profile the workers and the model's layers, assign contiguous\n" +
			"layers with --strategy, train with the --schedule over libp2p, snapshot the stages every\n" +
			"--checkpoint-every iterations, re-plan when a worker fails or its speed drifts, and\n" +
			"evaluate at the end. --workers N starts local `skyhive worker` processes; --join-wait N\n" +
			"waits for workers on other machines (it prints the `skyhive worker --join` command).\n" +
			"--regions or --latency/--bandwidth emulate wide-area links between local workers. With\n" +
			"local workers only (no --join-wait) the coordinator listens on loopback unless --listen says\n" +
			"otherwise; with --join-wait it prints where workers reach it and whether they can.",
		Example: "  skyhive train pipeline --workers 4 --slowdown-max 3 --strategy skyhive --steps 300\n" +
			"  skyhive train pipeline --workers 3 --model gpt-mini --data gcide --steps 200\n" +
			"  skyhive train pipeline --workers 4 --model deep-mlp:128x8 --latency 100ms --bandwidth 50\n" +
			"  skyhive train pipeline --listen /ip4/0.0.0.0/tcp/4001 --identity coord.key --join-wait 4",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return p.run(cmd) },
	}
	cmd.PreRunE = checkedNumbers(numberRules{Positive: []string{"epochs", "batch", "lr"}, Negative: []string{"kill-worker"}})
	fl := cmd.Flags()
	p.train.register(fl)
	p.train.registerModel(fl, "fashion-mnist or blobs; language models: "+train.TextDataUsage+", default gcide")
	fl.Lookup("model").Usage = "model: " + models.Usage() + "; or a language model: " + models.LMUsage() + " (a size without parameters, gpt-mini, takes --vocab and --seq)"
	p.train.lm.lmDataFlags.register(fl, 0)
	p.train.out.register(fl, "the result (plan, workers, events, last iteration)", "one per iteration, with per-stage times")
	fl.IntVar(&p.train.steps, "steps", 0, "stop after N iterations (0: --epochs)")
	fl.IntVar(&p.workers, "workers", 0, "launch N local skyhive worker processes on loopback")
	fl.StringVar(&p.slowdowns, "slowdowns", "", "comma-separated slowdown factor per local worker")
	fl.Float64Var(&p.slowdownMax, "slowdown-max", 1, "draw local workers' slowdowns from U[1,MAX] (seeded by --seed)")
	fl.StringVar(&p.memCaps, "mem-caps", "", "comma-separated memory cap in bytes per local worker")
	fl.IntVar(&p.joinWait, "join-wait", 0, "wait for N external workers to join (skyhive worker --join ADDR)")
	p.net.register(fl, "DHT peers of a swarm to publish this coordinator's status record (stages, plan, loss) through, for skyhive status and skyhive dashboard (optional: the pipeline does not need a DHT)")
	p.status.registerEvery(fl)
	fl.StringVar(&p.planFile, "plan", "", "fixed initial plan JSON {\"stages\":[{\"device\":0,\"first\":0,\"last\":4},...]}")
	fl.StringVar(&p.strategy, "strategy", "skyhive", "allocation strategy ("+strings.Join(alloc.StrategyNames(), ", ")+")")
	fl.StringVar(&p.schedule, "schedule", "1f1b", "schedule (sequential, gpipe, 1f1b)")
	fl.IntVar(&p.micro, "micro", 4, "micro-batches per batch (gpipe, 1f1b)")
	fl.Float64Var(&p.replanThreshold, "replan-threshold", 0.3, "re-plan when a stage's speed drifts by this fraction (0: only on failures)")
	fl.IntVar(&p.checkpointEvery, "checkpoint-every", 10, "snapshot all stages every N iterations")
	fl.DurationVar(&p.iterTimeout, "iter-timeout", time.Minute, "a stage that does not finish an iteration in time counts as failed")
	fl.IntVar(&p.logEvery, "log-every", 10, "print the per-stage breakdown every N iterations")
	fl.IntVar(&p.killWorker, "kill-worker", -1, "failure drill: SIGKILL local worker wK ...")
	fl.IntVar(&p.killAt, "kill-at", 0, "... before iteration N")
	fl.StringVar(&p.regions, "regions", "", "emulate the links between local workers with this netem region profile (e.g. examples/regions.json)")
	fl.StringVar(&p.workerRegions, "worker-regions", "", "comma-separated region per local worker (default: round-robin over the profile's regions)")
	fl.StringVar(&p.coordRegion, "coordinator-region", "", "the coordinator's region (default: the profile's first)")
	p.link.register(fl, "between two regions a and b of local workers (instead of --regions)", 0)
	fl.StringVar(&p.compare, "compare", "", "before training, measure the iteration time of these strategies' plans in turn (e.g. even,skyhive), then train with --strategy")
	fl.IntVar(&p.compareRounds, "compare-rounds", 5, "measured iterations per strategy of --compare (alternating, after one warm-up each)")
	p.train.metrics.register(fl)
	renameFlags(fl, map[string]string{"link-latency": "latency", "link-bandwidth": "bandwidth", "micro-batches": "micro"})
	return cmd
}

// network builds the emulated network of --regions or --link-latency and
// the region of every local worker; nil without emulation.
func (p *pipelineFlags) network(seed uint64) (*netem.Network, []string, error) {
	var prof *netem.Profile
	switch {
	case p.regions != "" && p.link.set():
		return nil, nil, errors.New("use either --regions or --latency/--bandwidth")
	case p.regions != "":
		var err error
		if prof, err = netem.LoadProfile(p.regions); err != nil {
			return nil, nil, fmt.Errorf("--regions: %w", err)
		}
	case p.link.set():
		inter, err := p.link.params()
		if err != nil {
			return nil, nil, err
		}
		prof = &netem.Profile{Regions: []string{"a", "b"}, Intra: netem.LinkParams{Latency: 500 * time.Microsecond, Bandwidth: 1e9},
			Inter: [][]netem.LinkParams{{{}, inter}, {inter, {}}}}
	default:
		if p.workerRegions != "" || p.coordRegion != "" {
			return nil, nil, errors.New("--worker-regions and --coordinator-region need --regions or --latency")
		}
		return nil, nil, nil
	}
	if err := prof.Validate(); err != nil {
		return nil, nil, err
	}
	if p.workers <= 0 {
		return nil, nil, errors.New("emulated links need local workers (--workers N): the proxies run in this process")
	}
	regions, _ := parseList(p.workerRegions, func(s string) (string, error) { return s, nil })
	if regions == nil {
		for i := range p.workers {
			regions = append(regions, prof.Regions[i%len(prof.Regions)])
		}
	}
	if len(regions) != p.workers {
		return nil, nil, fmt.Errorf("--worker-regions has %d regions for %d workers", len(regions), p.workers)
	}
	if p.coordRegion == "" {
		p.coordRegion = prof.Regions[0]
	}
	n, err := netem.New(prof, seed)
	if err != nil {
		return nil, nil, err
	}
	return n, regions, nil
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	if s == "" {
		return nil, nil
	}
	var out []T
	for f := range strings.SplitSeq(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// localSlowdownStream is the stream of the local workers' slowdown draws
// (profile.DrawSlowdowns).
const localSlowdownStream = 0x51d

// localSlowdowns returns the slowdown of every local worker: --slowdowns,
// or draws from U[1, --slowdown-max].
func (p *pipelineFlags) localSlowdowns(seed uint64) ([]float64, error) {
	sl, err := parseList(p.slowdowns, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	if err != nil {
		return nil, fmt.Errorf("--slowdowns: %w", err)
	}
	if sl != nil {
		if len(sl) != p.workers {
			return nil, fmt.Errorf("--slowdowns has %d values for %d workers", len(sl), p.workers)
		}
		return sl, nil
	}
	if p.slowdownMax < 1 {
		return nil, fmt.Errorf("--slowdown-max must be at least 1, got %v", p.slowdownMax)
	}
	return profile.DrawSlowdowns(p.workers, 1, p.slowdownMax, seed, localSlowdownStream), nil
}

// pipelineResult is what --json prints.
type pipelineResult struct {
	Iterations   int                        `json:"iterations"`
	Ran          int                        `json:"iterations_run"`
	Seconds      float64                    `json:"seconds"`
	FinalLoss    float64                    `json:"final_loss"`
	TestLoss     float64                    `json:"test_loss"`
	TestAccuracy float64                    `json:"test_accuracy"`
	Plan         alloc.Plan                 `json:"plan"`
	Workers      []pipeline.WorkerInfo      `json:"workers"`
	Events       []string                   `json:"events,omitempty"`
	Last         *pipeline.IterStats        `json:"last_iteration,omitempty"`
	Compare      []pipeline.PlanMeasurement `json:"compare,omitempty"`
	Config       map[string]interface{}     `json:"config"`
}

// run trains the model as a pipeline over workers.
func (p *pipelineFlags) run(cmd *cobra.Command) error {
	f := &p.train
	ctx := cmd.Context()
	out := cmd.ErrOrStderr()
	if err := f.cfg.Validate(); err != nil {
		return err
	}
	sched, err := pipeline.ParseSchedule(p.schedule)
	if err != nil {
		return err
	}
	if p.workers <= 0 && p.joinWait <= 0 {
		return errors.New("train pipeline needs --workers N (local processes) or --join-wait N (workers on other machines)")
	}
	var trainSet, testSet *data.Dataset
	var corpus *pipelineText
	if train.IsLanguageModel(f.cfg.Model) {
		if corpus, err = p.loadText(cmd, out); err != nil {
			return err
		}
	} else {
		if err := checkPipelineImageFlags(cmd.Flags(), f.cfg.Model); err != nil {
			return err
		}
		if trainSet, testSet, err = pipelineData(f); err != nil {
			return err
		}
	}
	reg, stopMetrics, err := f.metrics.start(ctx, out)
	if err != nil {
		return err
	}
	defer stopMetrics()
	p.live = &metrics.Live{}
	sc, n, err := p.startScenario(ctx, reg.Registerer(), out)
	if err != nil {
		return err
	}
	defer n.Close()
	defer sc.Close()
	plan, err := p.readPlan()
	if err != nil {
		return err
	}
	if corpus != nil {
		return p.trainLM(cmd, sc, sched, plan, corpus)
	}
	return p.trainImage(cmd, sc, sched, plan, trainSet, testSet)
}

// startScenario starts the coordinator's node, which publishes its status
// record with --dht, the coordinator on it, launches the local workers of
// --workers and waits for the --join-wait ones. Close the scenario, then
// the node.
func (p *pipelineFlags) startScenario(ctx context.Context, reg prometheus.Registerer, out io.Writer) (sc *pipeline.Scenario, n *node.Node, err error) {
	cfg, err := p.scenarioConfig(reg)
	if err != nil {
		return nil, nil, err
	}
	if err := p.status.check(); err != nil {
		return nil, nil, err
	}
	seeds, err := p.net.seeds()
	if err != nil {
		return nil, nil, err
	}
	n, err = pipeline.StartCoordinatorNode(ctx, cfg.Coordinator, pipeline.CoordinatorNode{
		DHT: node.BootstrapAddrs(seeds), StatusEvery: p.status.every, Metrics: reg, Log: out})
	if err != nil {
		return nil, nil, err
	}
	cfg.Coordinator.Transport = n.Host()
	if sc, err = pipeline.NewScenario(ctx, cfg); err != nil {
		return nil, nil, errors.Join(err, n.Close())
	}
	if err = p.launch(ctx, sc, n, cfg, out); err != nil {
		return nil, nil, errors.Join(err, sc.Close(), n.Close())
	}
	return sc, n, nil
}

// launch publishes the coordinator's status record on n, launches the
// local workers of --workers and waits for the --join-wait ones.
func (p *pipelineFlags) launch(ctx context.Context, sc *pipeline.Scenario, n *node.Node, cfg pipeline.ScenarioConfig, out io.Writer) error {
	c := sc.Coordinator()
	if p.joinWait > 0 {
		reportReach(ctx, c.Host(), out, nil)
	}
	if err := pipeline.PublishStatus(n, c, p.live); err != nil {
		return err
	}
	if p.workers > 0 {
		fmt.Fprintf(out, "launching %d local workers, slowdowns %s\n", p.workers, fmtFloats(cfg.Slowdowns))
		if cfg.Regions != nil {
			fmt.Fprintf(out, "emulated links: workers in regions %s, coordinator in %s\n", strings.Join(cfg.Regions, ","), p.coordRegion)
		}
	}
	if err := sc.Launch(ctx); err != nil || p.joinWait <= 0 {
		return err
	}
	fmt.Fprintf(out, "waiting for %d workers; start them with:\n", p.joinWait)
	for _, a := range c.Addrs() {
		fmt.Fprintf(out, "  skyhive worker --join %s\n", a)
	}
	return c.WaitWorkers(ctx, len(c.Workers())+p.joinWait)
}

// scenarioConfig is the coordinator of --listen and the emulated
// network, with the local workers of --workers, their slowdowns, memory
// caps and regions.
func (p *pipelineFlags) scenarioConfig(reg prometheus.Registerer) (pipeline.ScenarioConfig, error) {
	seed := p.train.cfg.Seed
	netw, regions, err := p.network(seed)
	if err != nil {
		return pipeline.ScenarioConfig{}, err
	}
	hcfg, err := p.net.config()
	if err != nil {
		return pipeline.ScenarioConfig{}, err
	}
	if len(hcfg.ListenAddrs) == 0 && p.joinWait == 0 {
		hcfg.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} // local workers only
	}
	hcfg.Metrics = reg
	cfg := pipeline.ScenarioConfig{
		Coordinator: pipeline.CoordinatorConfig{Host: hcfg, Network: netw, Region: p.coordRegion, Metrics: reg},
		Regions:     regions, WorkerOutput: os.Stderr,
	}
	if p.workers <= 0 {
		return cfg, nil
	}
	if cfg.Slowdowns, err = p.localSlowdowns(seed); err != nil {
		return cfg, err
	}
	caps, err := parseList(p.memCaps, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
	if err != nil || (caps != nil && len(caps) != p.workers) {
		return cfg, fmt.Errorf("--mem-caps needs %d integers: %v", p.workers, err)
	}
	cfg.MemCaps = caps
	if cfg.Binary, err = os.Executable(); err != nil {
		return cfg, fmt.Errorf("locating the skyhive binary: %w", err)
	}
	return cfg, nil
}

// readPlan reads --plan; nil without it.
func (p *pipelineFlags) readPlan() (*alloc.Plan, error) {
	if p.planFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(p.planFile)
	if err != nil {
		return nil, fmt.Errorf("--plan: %w", err)
	}
	plan := &alloc.Plan{}
	if err := json.Unmarshal(b, plan); err != nil {
		return nil, fmt.Errorf("--plan %s: %w", p.planFile, err)
	}
	return plan, nil
}

// sessionConfig is the session of the flags for model, trained total
// iterations with a peak learning rate lr that decays along a cosine to
// lr/minDiv after warmup iterations (at most a tenth of the run).
func (p *pipelineFlags) sessionConfig(model string, batch int, lr float64, warmup, total int64, minDiv, clip float64, sched pipeline.Schedule, plan *alloc.Plan, log io.Writer) pipeline.SessionConfig {
	f := &p.train
	return pipeline.SessionConfig{
		Model: model, Seed: f.cfg.Seed, Batch: batch, Micro: p.micro, Schedule: sched,
		Optim:      pipeline.OptimConfig{LR: lr, WeightDecay: f.cfg.WeightDecay},
		LRSchedule: &optim.Schedule{Peak: lr, Min: lr / minDiv, Warmup: min(warmup, total/10), Total: total, Decay: optim.Cosine},
		ClipNorm:   clip, Strategy: p.strategy, Plan: plan,
		Checkpoint: f.cfg.Checkpoint, Resume: f.cfg.Resume, CheckpointEvery: p.checkpointEvery,
		ReplanThreshold: p.replanThreshold, IterTimeout: p.iterTimeout, Log: log,
	}
}

// onIteration records every iteration for the status record and prints
// the per-stage table of the first, every --log-every-th and every one
// with an event.
func (p *pipelineFlags) onIteration(batch int, out io.Writer) func(pipeline.IterStats) error {
	return func(st pipeline.IterStats) error {
		pipeline.RecordStatus(p.live, st, batch)
		if st.Event != "" || st.Iter == 0 || (p.logEvery > 0 && (st.Iter+1)%p.logEvery == 0) {
			st.WriteTable(out)
		}
		return nil
	}
}

// trainImage trains an image classifier for --steps iterations (or
// --epochs), after measuring the plans of --compare, and evaluates it on
// the test set.
func (p *pipelineFlags) trainImage(cmd *cobra.Command, sc *pipeline.Scenario, sched pipeline.Schedule, plan *alloc.Plan, trainSet, testSet *data.Dataset) error {
	f, ctx, out := &p.train, cmd.Context(), cmd.ErrOrStderr()
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: f.cfg.BatchSize, Shuffle: true, Seed: f.cfg.Seed, DropLast: true})
	if err != nil {
		return err
	}
	total := int64(loader.Len() * f.cfg.Epochs)
	if f.steps > 0 {
		total = int64(f.steps)
	}
	s, err := sc.Start(ctx, p.sessionConfig(f.cfg.Model, f.cfg.BatchSize, f.cfg.LR, f.cfg.Warmup, total, 100, f.cfg.ClipNorm, sched, plan, out))
	if err != nil {
		return err
	}
	stats, closeStats, err := f.out.openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	topts := pipeline.TrainOptions{Data: pipeline.NewBatches(loader), Steps: int(total), Eval: testSet, EvalBatch: 512,
		OnIteration: p.onIteration(f.cfg.BatchSize, out), Stats: stats, BeforeStep: sc.FailureDrill(p.killWorker, p.killAt, out)}
	var compared []pipeline.PlanMeasurement
	if p.compare != "" {
		if compared, err = p.measurePlans(ctx, s, trainSet, f.cfg.BatchSize, f.cfg.Seed, out); err != nil {
			if ctx.Err() != nil {
				return err
			}
			// A worker lost while comparing is the training's to recover
			// from (it re-plans); the comparison is left out.
			fmt.Fprintf(out, "comparing plans failed, training without it: %v\n", err)
			compared = nil
		}
	}
	tr, err := s.Train(ctx, topts)
	if err != nil {
		return err
	}
	res := pipelineResult{
		Iterations: tr.Iterations, Ran: tr.Ran, Seconds: tr.Duration.Seconds(), FinalLoss: tr.Last.Loss, TestLoss: tr.TestLoss, TestAccuracy: tr.TestAccuracy,
		Plan: s.Plan(), Workers: sc.Coordinator().Workers(), Events: tr.Events, Last: &tr.Last, Compare: compared,
		Config: map[string]interface{}{"model": f.cfg.Model, "batch": f.cfg.BatchSize, "micro": p.micro, "schedule": sched.String(), "strategy": p.strategy},
	}
	if f.out.json {
		return printJSON(cmd.OutOrStdout(), res)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "pipeline: %d iterations run in %.1fs (%.1f ms/iteration; %d in all), final loss %.4f, test accuracy %.2f%%\n",
		res.Ran, res.Seconds, 1e3*res.Seconds/float64(max(res.Ran, 1)), res.Iterations, res.FinalLoss, 100*res.TestAccuracy)
	return nil
}

// measurePlans runs --compare: each strategy's plan for --compare-rounds
// iterations in turn (real training steps, on batches of their own), then
// installs --strategy's plan again for the training.
func (p *pipelineFlags) measurePlans(ctx context.Context, s *pipeline.Session, trainSet *data.Dataset, batch int, seed uint64, out io.Writer) ([]pipeline.PlanMeasurement, error) {
	if p.compareRounds < 1 {
		return nil, fmt.Errorf("--compare-rounds %d: want at least 1", p.compareRounds)
	}
	strategies := strings.Split(p.compare, ",")
	for _, name := range strategies {
		if !slices.Contains(alloc.StrategyNames(), name) {
			return nil, fmt.Errorf("--compare: unknown strategy %q (want some of %s)", name, strings.Join(alloc.StrategyNames(), ", "))
		}
	}
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: batch, Shuffle: true, Seed: seed + 1, DropLast: true})
	if err != nil {
		return nil, err
	}
	// Train on --strategy's plan: the one just measured if it was
	// compared.
	res, err := s.MeasureStrategies(ctx, strategies, p.strategy, pipeline.MeasureOptions{Data: pipeline.NewBatches(loader), Rounds: p.compareRounds}, out)
	if err != nil {
		return nil, fmt.Errorf("--compare: %w", err)
	}
	return res, nil
}

// pipelineData loads Fashion-MNIST, or Gaussian blobs with --data blobs.
func pipelineData(f *trainFlags) (trainSet, testSet *data.Dataset, err error) {
	switch f.dataset {
	case "blobs":
		all, err := data.GaussianBlobs(12000, pipeline.InputFeatures, data.NumClasses, f.cfg.Seed)
		if err != nil {
			return nil, nil, err
		}
		testSet, trainSet, err = all.Split(2000, f.cfg.Seed)
		return trainSet, testSet, err
	case "fashion-mnist":
		return f.data.load()
	}
	return nil, nil, fmt.Errorf("unknown data set %q (pipeline mode: fashion-mnist or blobs)", f.dataset)
}

func fmtFloats(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(parts, ",")
}

// checkPipelineImageFlags refuses the language-model flags for an image
// model.
func checkPipelineImageFlags(fl *pflag.FlagSet, model string) error {
	for _, name := range lmDataOnly {
		if fl.Changed(name) {
			return fmt.Errorf("--%s is for language models; %s is an image classifier (language models: %s)", name, model, models.LMUsage())
		}
	}
	return nil
}

// pipelineText is a language model's data for the pipeline: the spec
// completed with the vocabulary and context, and the tokens split into
// training and validation.
type pipelineText struct {
	name       string
	spec       string
	info       pipeline.ModelInfo
	train, val []int32
}

// loadText reads and tokenizes --data for a language model, as `skyhive
// train` does (train.Tokenize): a byte-level BPE of --vocab tokens trained
// on the text (or the ids of a token file), a tenth held out for
// validation, of which the first --eval-tokens are evaluated.
func (p *pipelineFlags) loadText(cmd *cobra.Command, out io.Writer) (*pipelineText, error) {
	f, fl, l := &p.train, cmd.Flags(), p.train.lm
	dataset := f.dataset
	if !fl.Changed("data") {
		dataset = "gcide"
	}
	if !train.IsTextData(dataset) {
		return nil, fmt.Errorf("%s is a language model and %s is images: train it on text (--data %s)", f.cfg.Model, dataset, train.TextDataUsage)
	}
	for _, name := range []string{"epochs", "limit", "data-dir", "compare"} {
		if fl.Changed(name) {
			return nil, fmt.Errorf("--%s is for image models; a language model trains for --steps on --data %s", name, dataset)
		}
	}
	if f.steps <= 0 {
		return nil, fmt.Errorf("a language model trains for --steps N (got %d)", f.steps)
	}
	tokenVocab := 0
	if strings.HasPrefix(dataset, "tokens:") {
		if !fl.Changed("vocab") {
			return nil, fmt.Errorf("--data %s: give the vocabulary of the token file with --vocab (50257 for GPT-2's tokenizer)", dataset)
		}
		tokenVocab = l.vocab
	}
	corpus, err := train.LoadCorpus(dataset, l.corpusBytes, l.tokenWidth, tokenVocab)
	if err != nil {
		return nil, err
	}
	d, err := train.Tokenize(corpus, train.TokenizeOptions{Vocab: l.vocab, Seed: f.cfg.Seed, Log: out})
	if err != nil {
		return nil, err
	}
	seq := l.seq
	spec := f.cfg.Model
	if strings.Contains(spec, ":") {
		if !fl.Changed("seq") {
			seq = 0 // the spec's
		}
	} else {
		spec = fmt.Sprintf("%s:%dx%d", spec, d.Vocab, seq)
	}
	info, err := pipeline.DescribeModel(spec)
	if err != nil {
		return nil, err
	}
	if info.Classes < d.Vocab {
		return nil, fmt.Errorf("model %s has a vocabulary of %d, but the data has %d token ids: give the model no vocabulary (--model %s) or a larger one",
			spec, info.Classes, d.Vocab, strings.SplitN(spec, ":", 2)[0])
	}
	if seq != 0 && info.Input[0] != seq {
		return nil, fmt.Errorf("model %s has a context of %d tokens but --seq is %d: set one of them", spec, info.Input[0], seq)
	}
	if err := d.CheckContext(info.Input[0]); err != nil {
		return nil, err
	}
	val, err := d.EvalIDs(l.evalTokens, info.Input[0])
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "%s: %d tokens (%d train, %d validation), vocabulary %d, model %s\n", corpus.Name, d.Tokens(), len(d.Train), len(val), d.Vocab, spec)
	return &pipelineText{name: corpus.Name, spec: spec, info: info, train: d.Train, val: val}, nil
}

// lmPipelineResult is what --json prints for a language model.
type lmPipelineResult struct {
	Model         string                 `json:"model"`
	Data          string                 `json:"data"`
	Iterations    int                    `json:"iterations"`
	Ran           int                    `json:"iterations_run"`
	Seconds       float64                `json:"seconds"`
	FinalLoss     float64                `json:"final_loss"`
	FinalAccuracy float64                `json:"final_token_accuracy"`
	ValLoss       float64                `json:"val_loss"`
	ValPerplexity float64                `json:"val_perplexity"`
	ValTokens     int                    `json:"val_tokens"`
	Plan          alloc.Plan             `json:"plan"`
	Workers       []pipeline.WorkerInfo  `json:"workers"`
	Events        []string               `json:"events,omitempty"`
	Last          *pipeline.IterStats    `json:"last_iteration,omitempty"`
	Config        map[string]interface{} `json:"config"`
}

// trainLM trains a language model for --steps iterations on windows
// drawn from the training tokens, then reports the validation loss and
// perplexity of the gathered model. The shared flags (--batch, --lr,
// --warmup, --clip) take the model's defaults (models.DefaultsOf) unless
// given.
func (p *pipelineFlags) trainLM(cmd *cobra.Command, sc *pipeline.Scenario, sched pipeline.Schedule, plan *alloc.Plan, corpus *pipelineText) error {
	f, ctx, out := &p.train, cmd.Context(), cmd.ErrOrStderr()
	h := withModelDefaults(cmd.Flags(), f.cfg.Model, models.TrainDefaults{Batch: f.cfg.BatchSize, LR: f.cfg.LR, Warmup: f.cfg.Warmup, ClipNorm: f.cfg.ClipNorm})
	batch, lr := h.Batch, h.LR
	total := int64(f.steps)
	s, err := sc.Start(ctx, p.sessionConfig(corpus.spec, batch, lr, h.Warmup, total, 10, h.ClipNorm, sched, plan, out))
	if err != nil {
		return err
	}
	sampler, err := text.NewSampler(corpus.train, batch, corpus.info.Input[0], f.cfg.Seed)
	if err != nil {
		return err
	}
	for range s.Iter() {
		sampler.Next() // a resumed run continues the sequence of batches
	}
	statsOut, closeStats, err := f.out.openStats()
	if err != nil {
		return err
	}
	defer closeStats()
	tr, err := s.Train(ctx, pipeline.TrainOptions{Tokens: sampler, Steps: int(total), EvalTokens: corpus.val, EvalBatch: 16,
		OnIteration: p.onIteration(batch, out), Stats: statsOut, BeforeStep: sc.FailureDrill(p.killWorker, p.killAt, out)})
	if err != nil {
		return err
	}
	res := lmPipelineResult{Model: corpus.spec, Data: corpus.name, ValTokens: len(corpus.val),
		Iterations: tr.Iterations, Ran: tr.Ran, Seconds: tr.Duration.Seconds(), FinalLoss: tr.Last.Loss, FinalAccuracy: tr.Last.Accuracy,
		ValLoss: tr.TestLoss, ValPerplexity: math.Exp(tr.TestLoss), Plan: s.Plan(), Workers: sc.Coordinator().Workers(), Events: tr.Events, Last: &tr.Last,
		Config: map[string]interface{}{"model": corpus.spec, "batch": batch, "micro": p.micro, "schedule": sched.String(), "strategy": p.strategy, "lr": lr}}
	if f.out.json {
		return printJSON(cmd.OutOrStdout(), res)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "pipeline: %d iterations run in %.1fs (%.1f ms/iteration; %d in all), final loss %.4f, token accuracy %.2f%%; validation loss %.4f, perplexity %.2f on %d tokens (%s)\n",
		res.Ran, res.Seconds, 1e3*res.Seconds/float64(max(res.Ran, 1)), res.Iterations, res.FinalLoss, 100*res.FinalAccuracy, res.ValLoss, res.ValPerplexity, res.ValTokens, res.Model)
	return nil
}
