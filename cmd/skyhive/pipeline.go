package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/skyhive/skyhive/swarm"
	"github.com/spf13/cobra"
)

// pipelineFlags are the options of `skyhive train --mode pipeline`.
type pipelineFlags struct {
	workers         int
	slowdowns       string
	slowdownMax     float64
	memCaps         string
	joinWait        int
	listen          []string
	identity        string
	planFile        string
	strategy        string
	schedule        string
	micro           int
	steps           int
	replanThreshold float64
	checkpointEvery int
	iterTimeout     time.Duration
	logEvery        int
	statsFile       string
	killWorker      int
	killAt          int
	regions         string
	workerRegions   string
	coordRegion     string
	linkLatency     time.Duration
	linkBandwidth   float64
}

func (p *pipelineFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&p.workers, "workers", 0, "pipeline: launch N local skyhive worker processes on loopback")
	fl.StringVar(&p.slowdowns, "slowdowns", "", "pipeline: comma-separated slowdown factor per local worker")
	fl.Float64Var(&p.slowdownMax, "slowdown-max", 1, "pipeline: draw local workers' slowdowns from U[1,MAX] (seeded by --seed)")
	fl.StringVar(&p.memCaps, "mem-caps", "", "pipeline: comma-separated memory cap in bytes per local worker")
	fl.IntVar(&p.joinWait, "join-wait", 0, "pipeline: wait for N external workers to join (skyhive worker --join ADDR)")
	fl.StringSliceVar(&p.listen, "listen", []string{"/ip4/127.0.0.1/tcp/0"}, "pipeline: coordinator listen multiaddrs")
	fl.StringVar(&p.identity, "identity", "", "pipeline: coordinator key file, for a stable --join address")
	fl.StringVar(&p.planFile, "plan", "", "pipeline: fixed initial plan JSON {\"stages\":[{\"device\":0,\"first\":0,\"last\":4},...]}")
	fl.StringVar(&p.strategy, "strategy", "skyhive", "pipeline: allocation strategy ("+strings.Join(alloc.StrategyNames(), ", ")+")")
	fl.StringVar(&p.schedule, "schedule", "1f1b", "pipeline: schedule (sequential, gpipe, 1f1b)")
	fl.IntVar(&p.micro, "micro", 4, "pipeline: micro-batches per batch (gpipe, 1f1b)")
	fl.IntVar(&p.steps, "steps", 0, "pipeline: stop after N iterations (0: --epochs)")
	fl.Float64Var(&p.replanThreshold, "replan-threshold", 0.3, "pipeline: re-plan when a stage's speed drifts by this fraction (0: only on failures)")
	fl.IntVar(&p.checkpointEvery, "checkpoint-every", 10, "pipeline: snapshot all stages every N iterations")
	fl.DurationVar(&p.iterTimeout, "iter-timeout", time.Minute, "pipeline: a stage that does not finish an iteration in time counts as failed")
	fl.IntVar(&p.logEvery, "log-every", 10, "pipeline: print the per-stage breakdown every N iterations")
	fl.StringVar(&p.statsFile, "stats", "", "pipeline: write every iteration's stats as JSON lines to this file")
	fl.IntVar(&p.killWorker, "kill-worker", -1, "pipeline: failure drill: SIGKILL local worker wK ...")
	fl.IntVar(&p.killAt, "kill-at", 0, "pipeline: ... before iteration N")
	fl.StringVar(&p.regions, "regions", "", "pipeline: emulate the links between local workers with this netem region profile (e.g. examples/regions.json)")
	fl.StringVar(&p.workerRegions, "worker-regions", "", "pipeline: comma-separated region per local worker (default: round-robin over the profile's regions)")
	fl.StringVar(&p.coordRegion, "coordinator-region", "", "pipeline: the coordinator's region (default: the profile's first)")
	fl.DurationVar(&p.linkLatency, "link-latency", 0, "pipeline: emulate two regions a and b with this one-way latency between them (instead of --regions)")
	fl.Float64Var(&p.linkBandwidth, "link-bandwidth", 0, "pipeline: ... and this bandwidth in Mbit/s between them (0: unlimited)")
}

// network builds the emulated network of --regions or --link-latency and
// the region of every local worker; nil without emulation.
func (p *pipelineFlags) network(seed uint64) (*netem.Network, []string, error) {
	var prof *netem.Profile
	switch {
	case p.regions != "" && (p.linkLatency > 0 || p.linkBandwidth > 0):
		return nil, nil, errors.New("use either --regions or --link-latency/--link-bandwidth")
	case p.regions != "":
		var err error
		if prof, err = netem.LoadProfile(p.regions); err != nil {
			return nil, nil, fmt.Errorf("--regions: %w", err)
		}
	case p.linkLatency > 0 || p.linkBandwidth > 0:
		if p.linkLatency < 0 || p.linkBandwidth < 0 {
			return nil, nil, errors.New("--link-latency and --link-bandwidth must not be negative")
		}
		inter := netem.LinkParams{Latency: p.linkLatency, Bandwidth: p.linkBandwidth * 1e6}
		prof = &netem.Profile{Regions: []string{"a", "b"}, Intra: netem.LinkParams{Latency: 500 * time.Microsecond, Bandwidth: 1e9},
			Inter: [][]netem.LinkParams{{{}, inter}, {inter, {}}}}
	default:
		if p.workerRegions != "" || p.coordRegion != "" {
			return nil, nil, errors.New("--worker-regions and --coordinator-region need --regions or --link-latency")
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

// localSlowdowns returns the slowdown of every local worker.
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
	rng := rand.New(rand.NewPCG(seed, 0x51d))
	sl = make([]float64, p.workers)
	for i := range sl {
		sl[i] = 1 + (p.slowdownMax-1)*rng.Float64()
	}
	return sl, nil
}

// pipelineResult is what --json prints.
type pipelineResult struct {
	Iterations   int                    `json:"iterations"`
	Seconds      float64                `json:"seconds"`
	FinalLoss    float64                `json:"final_loss"`
	TestLoss     float64                `json:"test_loss"`
	TestAccuracy float64                `json:"test_accuracy"`
	Plan         alloc.Plan             `json:"plan"`
	Workers      []pipeline.WorkerInfo  `json:"workers"`
	Events       []string               `json:"events,omitempty"`
	Last         *pipeline.IterStats    `json:"last_iteration,omitempty"`
	Config       map[string]interface{} `json:"config"`
}

// runPipeline trains f.cfg's model as a pipeline of stage workers.
func (f *trainFlags) runPipeline(cmd *cobra.Command) error { return f.pipe.run(cmd, f) }

// run trains f.cfg's model as a pipeline over workers.
func (p *pipelineFlags) run(cmd *cobra.Command, f *trainFlags) error {
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
		return errors.New("pipeline mode needs --workers N (local processes) or --join-wait N (external workers)")
	}
	trainSet, testSet, err := pipelineData(f)
	if err != nil {
		return err
	}
	netw, regions, err := p.network(f.cfg.Seed)
	if err != nil {
		return err
	}
	c, err := pipeline.NewCoordinator(ctx, pipeline.CoordinatorConfig{ListenAddrs: p.listen, IdentityFile: p.identity, Network: netw, Region: p.coordRegion})
	if err != nil {
		return err
	}
	defer c.Close()
	var local *swarm.LocalProcs
	if p.workers > 0 {
		sl, err := p.localSlowdowns(f.cfg.Seed)
		if err != nil {
			return err
		}
		caps, err := parseList(p.memCaps, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
		if err != nil || (caps != nil && len(caps) != p.workers) {
			return fmt.Errorf("--mem-caps needs %d integers: %v", p.workers, err)
		}
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("locating the skyhive binary: %w", err)
		}
		fmt.Fprintf(out, "launching %d local workers, slowdowns %s\n", p.workers, fmtFloats(sl))
		if regions != nil {
			fmt.Fprintf(out, "emulated links: workers in regions %s, coordinator in %s\n", strings.Join(regions, ","), p.coordRegion)
		}
		if local, err = swarm.LaunchPipelineWorkers(ctx, c, swarm.PipelineLaunch{Binary: exe, Slowdowns: sl, MemCaps: caps, Regions: regions, Output: os.Stderr}); err != nil {
			return err
		}
		defer local.Close()
	}
	defer c.Shutdown(ctx)
	if p.joinWait > 0 {
		fmt.Fprintf(out, "waiting for %d workers; start them with:\n", p.joinWait)
		for _, a := range c.Addrs() {
			fmt.Fprintf(out, "  skyhive worker --join %s\n", a)
		}
		if err := c.WaitWorkers(ctx, len(c.Workers())+p.joinWait); err != nil {
			return err
		}
	}
	var plan *alloc.Plan
	if p.planFile != "" {
		b, err := os.ReadFile(p.planFile)
		if err != nil {
			return fmt.Errorf("--plan: %w", err)
		}
		plan = &alloc.Plan{}
		if err := json.Unmarshal(b, plan); err != nil {
			return fmt.Errorf("--plan %s: %w", p.planFile, err)
		}
	}
	loader, err := data.NewLoader(trainSet, data.BatchOptions{Size: f.cfg.BatchSize, Shuffle: true, Seed: f.cfg.Seed, DropLast: true})
	if err != nil {
		return err
	}
	total := int64(loader.Len() * f.cfg.Epochs)
	if p.steps > 0 {
		total = int64(p.steps)
	}
	scfg := pipeline.SessionConfig{
		Model: f.cfg.Model, Seed: f.cfg.Seed, Batch: f.cfg.BatchSize, Micro: p.micro, Schedule: sched,
		Optim:      pipeline.OptimConfig{LR: f.cfg.LR, WeightDecay: f.cfg.WeightDecay},
		LRSchedule: &optim.Schedule{Peak: f.cfg.LR, Min: f.cfg.LR / 100, Warmup: min(f.cfg.Warmup, total/10), Total: total, Decay: optim.Cosine},
		ClipNorm:   f.cfg.ClipNorm, Strategy: p.strategy, Plan: plan,
		Checkpoint: f.cfg.Checkpoint, Resume: f.cfg.Resume, CheckpointEvery: p.checkpointEvery,
		ReplanThreshold: p.replanThreshold, IterTimeout: p.iterTimeout, Log: out,
	}
	s, err := c.Start(ctx, scfg)
	if err != nil {
		return err
	}
	defer s.Close()
	topts := pipeline.TrainOptions{Data: pipeline.NewBatches(loader), Steps: int(total), Eval: testSet, EvalBatch: 512,
		OnIteration: func(st pipeline.IterStats) error {
			if st.Event != "" || st.Iter == 0 || (p.logEvery > 0 && (st.Iter+1)%p.logEvery == 0) {
				st.WriteTable(out)
			}
			return nil
		}}
	if p.statsFile != "" {
		fh, err := os.Create(p.statsFile)
		if err != nil {
			return err
		}
		defer fh.Close()
		topts.Stats = fh
	}
	if local != nil && p.killWorker >= 0 {
		topts.BeforeStep = func(_ context.Context, iter int) error {
			if p.killWorker < 0 || iter != p.killAt {
				return nil
			}
			fmt.Fprintf(out, "failure drill: killing worker w%d before iteration %d\n", p.killWorker, iter)
			w := p.killWorker
			p.killWorker = -1
			return local.Kill(w)
		}
	}
	tr, err := s.Train(ctx, topts)
	if err != nil {
		return err
	}
	res := pipelineResult{
		Iterations: tr.Iterations, Seconds: tr.Duration.Seconds(), FinalLoss: tr.Last.Loss, TestLoss: tr.TestLoss, TestAccuracy: tr.TestAccuracy,
		Plan: s.Plan(), Workers: c.Workers(), Events: tr.Events, Last: &tr.Last,
		Config: map[string]interface{}{"model": f.cfg.Model, "batch": f.cfg.BatchSize, "micro": p.micro, "schedule": sched.String(), "strategy": p.strategy},
	}
	if f.asJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "pipeline: %d iterations in %.1fs (%.1f ms/iteration), final loss %.4f, test accuracy %.2f%%\n",
		res.Iterations, res.Seconds, 1e3*res.Seconds/float64(max(res.Iterations, 1)), res.FinalLoss, 100*res.TestAccuracy)
	return nil
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
		if trainSet, err = data.LoadFashionMNIST(f.dataDir, data.Train, data.LoadOptions{Standardize: true, Limit: f.limit}); err != nil {
			return nil, nil, err
		}
		testSet, err = data.LoadFashionMNIST(f.dataDir, data.Test, data.LoadOptions{Standardize: true})
		return trainSet, testSet, err
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
