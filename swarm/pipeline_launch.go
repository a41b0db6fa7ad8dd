package swarm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// PipelineCoordinator is what LaunchPipelineWorkers needs from a pipeline
// coordinator; *pipeline.Coordinator implements it.
type PipelineCoordinator interface {
	// JoinAddr prepares the coordinator for a local worker named name in
	// region ("" for none) and returns the address it should join at.
	JoinAddr(name, region string) (string, error)
	// LiveWorkers is the number of live registered workers.
	LiveWorkers() int
	// WaitWorkers blocks until at least n live workers have registered.
	WaitWorkers(ctx context.Context, n int) error
}

// PipelineLaunch configures LaunchPipelineWorkers.
type PipelineLaunch struct {
	// Binary is the skyhive executable (os.Executable() from the CLI).
	Binary string
	// Slowdowns has one factor ≥ 1 per worker to start.
	Slowdowns []float64
	// MemCaps, if set, has one memory cap in bytes per worker (0: none).
	MemCaps []int64
	// Regions, if set, has one network region per worker (required when
	// the coordinator emulates links: the workers then join and talk
	// through its netem routes).
	Regions []string
	// Worker is every worker's config (e.g. Steady); LaunchPipelineWorkers
	// sets its Join, Name, Slowdown, listen address, Region and MemCap.
	Worker launch.Worker
	// Dir holds the workers' config files and logs, NAME.launch.json and
	// NAME.launch.log (default: a temporary directory, removed when the
	// workers are closed).
	Dir string
	// Env is added to the children's environment.
	Env []string
	// Output receives the children's stdout and stderr (nil discards).
	Output io.Writer
	// JoinTimeout bounds the wait for all workers to register (default
	// 30 s).
	JoinTimeout time.Duration
}

// PipelineWorker is the config of a worker named name, from base, that
// joins at join on loopback. region "" and memCap 0 are left out.
func PipelineWorker(base launch.Worker, join, name string, slowdown float64, region string, memCap int64) launch.Worker {
	w := base
	w.Join, w.Name, w.Slowdown, w.Listen = join, name, slowdown, []string{"/ip4/127.0.0.1/tcp/0"}
	w.Region, w.MemCap = region, memCap
	return w
}

// LaunchPipelineWorkers starts one `skyhive worker` process per slowdown
// on this machine, joined to c over loopback, each once the
// previous one has registered, and returns once all of them have. The
// workers are named w0, w1, … and register in that order.
func LaunchPipelineWorkers(ctx context.Context, c PipelineCoordinator, cfg PipelineLaunch) (*LocalProcs, error) {
	if cfg.Binary == "" {
		return nil, errors.New("swarm: no skyhive binary to launch")
	}
	if cfg.MemCaps != nil && len(cfg.MemCaps) != len(cfg.Slowdowns) {
		return nil, fmt.Errorf("swarm: %d memory caps for %d workers", len(cfg.MemCaps), len(cfg.Slowdowns))
	}
	if cfg.Regions != nil && len(cfg.Regions) != len(cfg.Slowdowns) {
		return nil, fmt.Errorf("swarm: %d regions for %d workers", len(cfg.Regions), len(cfg.Slowdowns))
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 30 * time.Second
	}
	l := &LocalProcs{}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "skyhive-workers-")
		if err != nil {
			return nil, fmt.Errorf("swarm: %w", err)
		}
		cfg.Dir, l.tmp = dir, dir
	}
	before := c.LiveWorkers()
	wctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
	defer cancel()
	for i, f := range cfg.Slowdowns {
		name := fmt.Sprintf("w%d", i)
		region, memCap := "", int64(0)
		if cfg.Regions != nil {
			region = cfg.Regions[i]
		}
		if cfg.MemCaps != nil {
			memCap = cfg.MemCaps[i]
		}
		join, err := c.JoinAddr(name, region)
		if err != nil {
			l.Close()
			return nil, err
		}
		w := PipelineWorker(cfg.Worker, join, name, f, region, memCap)
		path := filepath.Join(cfg.Dir, name+".launch.json")
		if err := l.Start(cfg.Binary, path, w, cfg.Env, cfg.Output); err != nil {
			l.Close()
			return nil, fmt.Errorf("swarm: start worker %s: %w", name, err)
		}
		// One at a time, so the workers register (and are planned, by the
		// order-keeping strategies) in the order w0, w1, …
		if err := c.WaitWorkers(wctx, before+i+1); err != nil {
			if t := launch.Tail(logPath(path), 3); t != "" {
				err = fmt.Errorf("%w (worker %s's output ends: %s)", err, name, t)
			}
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// LocalProcs are child processes on this machine, indexed in the order
// they were started. Its methods are safe for concurrent use.
type LocalProcs struct {
	tmp  string // a directory of config files to remove on Close ("": none)
	mu   sync.Mutex
	cmds []*exec.Cmd
	done []chan struct{}
}

// Start runs binary as a child process with the role config cfg, written
// at path (`binary @path`), with env added to this process's environment
// and its stdout and stderr going to logPath(path) and to out (nil: only
// the file).
func (l *LocalProcs) Start(binary, path string, cfg launch.Config, env []string, out io.Writer) error {
	cmd, err := launch.Command(binary, path, cfg)
	if err != nil {
		return fmt.Errorf("swarm: %w", err)
	}
	log, err := os.Create(logPath(path))
	if err != nil {
		return fmt.Errorf("swarm: %w", err)
	}
	cmd.Env = append(cmd.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if out != nil {
		w := io.MultiWriter(log, out)
		cmd.Stdout, cmd.Stderr = w, w
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("swarm: start %s: %w", binary, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		log.Close()
		close(done)
	}()
	l.mu.Lock()
	l.cmds, l.done = append(l.cmds, cmd), append(l.done, done)
	l.mu.Unlock()
	return nil
}

// logPath is where Start writes the output of the child whose config is
// at path: w0.launch.json's in w0.launch.log.
func logPath(path string) string { return strings.TrimSuffix(path, ".json") + ".log" }

// Len is the number of started processes.
func (l *LocalProcs) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cmds)
}

// Kill ends process i abruptly with SIGKILL, as a crash would, and waits
// for it.
func (l *LocalProcs) Kill(i int) error {
	l.mu.Lock()
	if i < 0 || i >= len(l.cmds) {
		l.mu.Unlock()
		return fmt.Errorf("swarm: no local process %d", i)
	}
	cmd, done := l.cmds[i], l.done[i]
	l.mu.Unlock()
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		return fmt.Errorf("swarm: kill process %d: %w", i, err)
	}
	<-done
	return nil
}

// Close asks every process to stop with SIGTERM, kills those still
// running after 5 s and waits for all of them.
func (l *LocalProcs) Close() error {
	l.mu.Lock()
	cmds, dones := l.cmds, l.done
	l.mu.Unlock()
	for i, cmd := range cmds {
		select {
		case <-dones[i]:
		default:
			cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for i, cmd := range cmds {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-dones[i]:
		case <-t.C:
			cmd.Process.Kill()
			<-dones[i]
		}
		t.Stop()
	}
	if l.tmp != "" {
		return os.RemoveAll(l.tmp)
	}
	return nil
}
