package pipeline

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

	"github.com/libp2p/go-libp2p/core/peer"
)

// LocalConfig configures LaunchLocal.
type LocalConfig struct {
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

// LocalWorkers are `skyhive worker` child processes on loopback.
type LocalWorkers struct {
	mu    sync.Mutex
	cmds  []*exec.Cmd
	done  []chan struct{}
	names []string
}

// LaunchLocal starts one `skyhive worker --join` process per slowdown on
// this machine, joined to c over loopback, each once the previous one has
// registered, and returns once all of them have. The workers are named
// w0, w1, … and register in that order.
func LaunchLocal(ctx context.Context, c *Coordinator, cfg LocalConfig) (*LocalWorkers, error) {
	if cfg.Binary == "" {
		return nil, errors.New("pipeline: no skyhive binary to launch")
	}
	if cfg.MemCaps != nil && len(cfg.MemCaps) != len(cfg.Slowdowns) {
		return nil, fmt.Errorf("pipeline: %d memory caps for %d workers", len(cfg.MemCaps), len(cfg.Slowdowns))
	}
	if cfg.Regions != nil && len(cfg.Regions) != len(cfg.Slowdowns) {
		return nil, fmt.Errorf("pipeline: %d regions for %d workers", len(cfg.Regions), len(cfg.Slowdowns))
	}
	if c.emu != nil && cfg.Regions == nil {
		return nil, errors.New("pipeline: the coordinator emulates links: give every local worker a region")
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 30 * time.Second
	}
	before := 0
	for _, w := range c.Workers() {
		if w.Alive {
			before++
		}
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
	defer cancel()
	l := &LocalWorkers{}
	for i, f := range cfg.Slowdowns {
		name := fmt.Sprintf("w%d", i)
		if c.emu != nil {
			if err := c.emu.n.Assign(peer.ID(name), cfg.Regions[i]); err != nil {
				l.Close()
				return nil, fmt.Errorf("pipeline: worker %s: %w", name, err)
			}
		}
		join, err := c.joinRoute(name)
		if err != nil {
			l.Close()
			return nil, err
		}
		args := []string{"worker", "--join", join, "--name", name, "--slowdown", strconv.FormatFloat(f, 'g', -1, 64), "--listen", "/ip4/127.0.0.1/tcp/0"}
		if cfg.Regions != nil {
			args = append(args, "--region", cfg.Regions[i])
		}
		if cfg.MemCaps != nil && cfg.MemCaps[i] > 0 {
			args = append(args, "--mem-cap", strconv.FormatInt(cfg.MemCaps[i], 10))
		}
		cmd := exec.Command(cfg.Binary, append(args, cfg.Args...)...)
		cmd.Env = append(cmd.Environ(), cfg.Env...)
		cmd.Stdout, cmd.Stderr = cfg.Output, cfg.Output
		if err := cmd.Start(); err != nil {
			l.Close()
			return nil, fmt.Errorf("pipeline: start worker %s: %w", name, err)
		}
		done := make(chan struct{})
		go func() {
			cmd.Wait()
			close(done)
		}()
		l.mu.Lock()
		l.cmds, l.done, l.names = append(l.cmds, cmd), append(l.done, done), append(l.names, name)
		l.mu.Unlock()
		// One at a time, so the workers register (and are planned, by the
		// order-keeping strategies) in the order w0, w1, …
		if err := c.WaitWorkers(wctx, before+i+1); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// Len is the number of launched workers.
func (l *LocalWorkers) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cmds)
}

// Kill ends worker i (named w<i>) abruptly with SIGKILL, as a crash would.
func (l *LocalWorkers) Kill(i int) error {
	l.mu.Lock()
	if i < 0 || i >= len(l.cmds) {
		l.mu.Unlock()
		return fmt.Errorf("pipeline: no local worker %d", i)
	}
	cmd, done := l.cmds[i], l.done[i]
	l.mu.Unlock()
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		return fmt.Errorf("pipeline: kill worker %d: %w", i, err)
	}
	<-done
	return nil
}

// Close asks every worker to stop with SIGTERM, kills those still running
// after 5 s and waits for all of them.
func (l *LocalWorkers) Close() error {
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
		select {
		case <-dones[i]:
		case <-time.After(time.Until(deadline)):
			cmd.Process.Kill()
			<-dones[i]
		}
	}
	return nil
}
