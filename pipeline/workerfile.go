package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/p2p"
)

// WorkerFromLaunch is the WorkerConfig of a worker launched with a typed
// config (what swarm.LaunchPipelineWorkers writes for each child): its
// coordinator, name, emulated speed, region, memory cap and listen
// addresses.
func WorkerFromLaunch(w launch.Worker) WorkerConfig {
	cfg := WorkerConfig{Join: w.Join, Name: w.Name, Slowdown: w.Slowdown, Steady: w.Steady,
		Region: w.Region, MemCap: w.MemCap, Heartbeat: time.Duration(w.Heartbeat),
		Host: p2p.Config{ListenAddrs: w.Listen}}
	if len(cfg.Host.ListenAddrs) == 0 {
		cfg.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	return cfg
}

// RunWorkerFile runs the worker described by the launch file at path (the
// argument "@path" a launched child gets) until the coordinator shuts it
// down or ctx ends. Test programs that stand in for the skyhive binary use
// it to serve as launched workers.
func RunWorkerFile(ctx context.Context, path string) error {
	f, err := launch.Read(path)
	if err != nil {
		return err
	}
	var w launch.Worker
	if err := f.Decode(&w); err != nil {
		return fmt.Errorf("pipeline: worker file %s: %w", path, err)
	}
	return RunWorker(ctx, WorkerFromLaunch(w))
}
