package swarm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// PipelineCoordinator is what LaunchPipelineWorkers needs from a pipeline
// coordinator; *pipeline.Coordinator implements it.
type PipelineCoordinator interface {
	// JoinAddr prepares the coordinator for a local worker named name in
	// region ("" for none) and returns the --join address it should use.
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
	// Args are extra arguments for every `skyhive worker`.
	Args []string
	// Env is added to the children's environment.
	Env []string
	// Output receives the children's stdout and stderr (nil discards).
	Output io.Writer
	// JoinTimeout bounds the wait for all workers to register (default
	// 30 s).
	JoinTimeout time.Duration
}

// PipelineWorkerArgs is the command line, after the executable, of a
// `skyhive worker` named name that joins at join on loopback. region ""
// and memCap 0 are left out.
func PipelineWorkerArgs(join, name string, slowdown float64, region string, memCap int64) []string {
	args := []string{"worker", "--join", join, "--name", name, "--slowdown", strconv.FormatFloat(slowdown, 'g', -1, 64), "--listen", "/ip4/127.0.0.1/tcp/0"}
	if region != "" {
		args = append(args, "--region", region)
	}
	if memCap > 0 {
		args = append(args, "--mem-cap", strconv.FormatInt(memCap, 10))
	}
	return args
}

// LaunchPipelineWorkers starts one `skyhive worker --join` process per
// slowdown on this machine, joined to c over loopback, each once the
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
	before := c.LiveWorkers()
	wctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
	defer cancel()
	l := &LocalProcs{}
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
		args := append(PipelineWorkerArgs(join, name, f, region, memCap), cfg.Args...)
		if err := l.Start(cfg.Binary, args, cfg.Env, cfg.Output); err != nil {
			l.Close()
			return nil, fmt.Errorf("swarm: start worker %s: %w", name, err)
		}
		// One at a time, so the workers register (and are planned, by the
		// order-keeping strategies) in the order w0, w1, …
		if err := c.WaitWorkers(wctx, before+i+1); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// LocalProcs are child processes on this machine, indexed in the order
// they were started. Its methods are safe for concurrent use.
type LocalProcs struct {
	mu   sync.Mutex
	cmds []*exec.Cmd
	done []chan struct{}
}

// Start runs binary with args as a child process, with env added to this
// process's environment and its stdout and stderr going to out (nil
// discards them).
func (l *LocalProcs) Start(binary string, args, env []string, out io.Writer) error {
	cmd := exec.Command(binary, args...)
	cmd.Env = append(cmd.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("swarm: start %s: %w", binary, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	l.mu.Lock()
	l.cmds, l.done = append(l.cmds, cmd), append(l.done, done)
	l.mu.Unlock()
	return nil
}

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
	return nil
}
