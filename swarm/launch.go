package swarm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/skyhive/skyhive/launch"
)

// RunFunc is a goroutine peer's body. It should return when ctx ends (the
// peer was killed or the swarm stopped), call p.Device.Throttle after its
// compute and p.Device.Checkpoint at safe points, and report metrics to
// p.Metrics.
type RunFunc func(ctx context.Context, p *Peer) error

// Goroutines launches each peer as a goroutine running run.
func Goroutines(run RunFunc) Launcher { return goroutineLauncher{run} }

type goroutineLauncher struct{ run RunFunc }

func (g goroutineLauncher) launch(ctx context.Context, p *Peer) (instance, error) {
	ctx, cancel := context.WithCancel(ctx)
	gi := &goroutineInstance{dev: p.Device, cancel: cancel, doneCh: make(chan struct{})}
	go func() {
		defer close(gi.doneCh)
		defer cancel()
		gi.err = g.run(ctx, p)
	}()
	return gi, nil
}

type goroutineInstance struct {
	dev    *Device
	cancel context.CancelFunc
	doneCh chan struct{}
	err    error // written before doneCh closes
}

func (g *goroutineInstance) kill() error                  { g.cancel(); return nil }
func (g *goroutineInstance) pause() error                 { g.dev.Pause(); return nil }
func (g *goroutineInstance) resume() error                { g.dev.Resume(); return nil }
func (g *goroutineInstance) setSlowdown(f float64) error  { return g.dev.SetSlowdown(f) }
func (g *goroutineInstance) done() <-chan struct{}        { return g.doneCh }
func (g *goroutineInstance) metrics() (PeerMetrics, bool) { return PeerMetrics{}, false }
func (g *goroutineInstance) stop(timeout time.Duration)   { g.cancel(); <-g.doneCh }
func (g *goroutineInstance) result() error {
	<-g.doneCh
	if errors.Is(g.err, context.Canceled) {
		return nil // ended because it was told to
	}
	return g.err
}

// Environment variables a child process receives (read them with
// ChildFromEnv).
const (
	EnvName     = "SKYHIVE_PEER_NAME"
	EnvIndex    = "SKYHIVE_PEER_INDEX"
	EnvClass    = "SKYHIVE_PEER_CLASS"
	EnvRegion   = "SKYHIVE_PEER_REGION"
	EnvSlowdown = "SKYHIVE_SLOWDOWN"
	EnvMemory   = "SKYHIVE_MEMORY_BYTES"
	EnvControl  = "SKYHIVE_CONTROL_FILE"
	EnvMetrics  = "SKYHIVE_METRICS_FILE"
)

// Processes launches each peer as a child process of Path. Its stdout and
// stderr go to Dir/NAME.log; the peer's identity and device come in the
// environment (see ChildFromEnv), with GOMEMLIMIT set to the memory cap.
// Pause and Resume send SIGSTOP and SIGCONT to the child's process group,
// Kill sends SIGKILL, and Stop sends SIGTERM, then SIGKILL after the stop
// timeout. A slowdown change is written to the child's control file.
type Processes struct {
	// Path is the executable.
	Path string
	// Args returns the arguments for a peer (may be nil).
	Args func(p *Peer) []string
	// Config, if set instead of Args, returns the typed config of a
	// skyhive role for a peer: it is written to Dir/NAME.launch.json and
	// the child started as `Path @FILE` (see package launch).
	Config func(p *Peer) launch.Config
	// Env returns extra environment entries "K=V" for a peer (may be nil).
	Env func(p *Peer) []string
	// Dir holds logs, control and metrics files; it is created if needed.
	Dir string
	// Wrap, if set, returns a command prefix for a peer, e.g. `ip netns
	// exec NS` to start it inside a network namespace (the prefix must exec
	// the command, so that signals reach it).
	Wrap func(p *Peer) []string
	// SplitStdout sends the child's stdout to Dir/NAME.out (its result)
	// and only its stderr to Dir/NAME.log.
	SplitStdout bool
	// Ready, if set, is called after a peer's process started and must
	// return once the peer is ready for the next one (e.g. listens), or an
	// error; exited is closed if the process ends. On an error the process
	// is killed and the launch fails.
	Ready func(ctx context.Context, p *Peer, exited <-chan struct{}) error
}

// openOutput opens a peer's output file: truncated at its first start,
// appended to when it is restarted.
func openOutput(path string, first bool) (*os.File, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if first {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	return f, nil
}

func (pr *Processes) launch(ctx context.Context, p *Peer) (instance, error) {
	if pr.Path == "" || pr.Dir == "" {
		return nil, errors.New("swarm: Processes needs Path and Dir")
	}
	if err := os.MkdirAll(pr.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	base := filepath.Join(pr.Dir, p.Name)
	pi := &processInstance{control: base + ".control", metricsPath: base + ".metrics.json", doneCh: make(chan struct{})}
	os.Remove(pi.metricsPath)
	if err := writeControl(pi.control, p.Device.Slowdown()); err != nil {
		return nil, err
	}
	first := p.Starts() == 0
	log, err := openOutput(base+".log", first)
	if err != nil {
		return nil, err
	}
	stdout := log
	if pr.SplitStdout {
		if stdout, err = openOutput(base+".out", first); err != nil {
			log.Close()
			return nil, err
		}
	}
	closeOutput := func() {
		log.Close()
		if stdout != log {
			stdout.Close()
		}
	}
	cmd, err := pr.command(p, base)
	if err != nil {
		closeOutput()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = stdout, log
	cmd.Env = append(os.Environ(),
		EnvName+"="+p.Name,
		EnvIndex+"="+strconv.Itoa(p.Index),
		EnvClass+"="+p.Class,
		EnvRegion+"="+p.Region,
		EnvSlowdown+"="+strconv.FormatFloat(p.Device.Slowdown(), 'g', -1, 64),
		EnvMemory+"="+strconv.FormatInt(p.Device.MemoryBytes(), 10),
		EnvControl+"="+pi.control,
		EnvMetrics+"="+pi.metricsPath,
	)
	if m := p.Device.MemoryBytes(); m > 0 {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+strconv.FormatInt(m, 10))
	}
	if pr.Env != nil {
		cmd.Env = append(cmd.Env, pr.Env(p)...)
	}
	// Own process group, so signals reach the child's children too; the
	// child is killed if this process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		closeOutput()
		return nil, fmt.Errorf("swarm: %w", err)
	}
	pi.pid = cmd.Process.Pid
	go func() {
		defer close(pi.doneCh)
		pi.err = cmd.Wait()
		closeOutput()
	}()
	if pr.Ready != nil {
		if err := pr.Ready(ctx, p, pi.doneCh); err != nil {
			pi.signal(syscall.SIGKILL)
			<-pi.doneCh
			return nil, err
		}
	}
	return pi, nil
}

// command returns the command that starts peer p, whose files start with
// base.
func (pr *Processes) command(p *Peer, base string) (*exec.Cmd, error) {
	var cmd *exec.Cmd
	switch {
	case pr.Config != nil && pr.Args != nil:
		return nil, errors.New("swarm: Processes has both Args and Config")
	case pr.Config != nil:
		c, err := launch.Command(pr.Path, base+".launch.json", pr.Config(p))
		if err != nil {
			return nil, fmt.Errorf("swarm: %s: %w", p.Name, err)
		}
		cmd = c
	case pr.Args != nil:
		cmd = exec.Command(pr.Path, pr.Args(p)...)
	default:
		cmd = exec.Command(pr.Path)
	}
	if pr.Wrap != nil {
		if w := pr.Wrap(p); len(w) > 0 {
			cmd = exec.Command(w[0], append(w[1:len(w):len(w)], cmd.Args...)...)
		}
	}
	return cmd, nil
}

type processInstance struct {
	pid         int
	control     string
	metricsPath string
	doneCh      chan struct{}
	err         error // written before doneCh closes
	stopOnce    sync.Once
}

// signal sends sig to the child's process group unless it has exited.
func (pi *processInstance) signal(sig syscall.Signal) error {
	select {
	case <-pi.doneCh:
		return nil
	default:
	}
	if err := syscall.Kill(-pi.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("swarm: signal %v to %d: %w", sig, pi.pid, err)
	}
	return nil
}

func (pi *processInstance) kill() error                 { return pi.signal(syscall.SIGKILL) }
func (pi *processInstance) pause() error                { return pi.signal(syscall.SIGSTOP) }
func (pi *processInstance) resume() error               { return pi.signal(syscall.SIGCONT) }
func (pi *processInstance) setSlowdown(f float64) error { return writeControl(pi.control, f) }
func (pi *processInstance) done() <-chan struct{}       { return pi.doneCh }

func (pi *processInstance) stop(timeout time.Duration) {
	pi.stopOnce.Do(func() {
		pi.signal(syscall.SIGTERM)
		pi.signal(syscall.SIGCONT) // a stopped process must run to exit
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-pi.doneCh:
			return
		case <-t.C:
		}
		pi.signal(syscall.SIGKILL)
		<-pi.doneCh
	})
}

func (pi *processInstance) result() error {
	<-pi.doneCh
	return pi.err
}

func (pi *processInstance) metrics() (PeerMetrics, bool) {
	m, err := readMetricsFile(pi.metricsPath)
	if err != nil {
		return PeerMetrics{}, true // a child that never flushed has none
	}
	return m, true
}

// Child is this process's identity when a Processes launcher started it.
type Child struct {
	Index  int
	Name   string
	Class  string
	Region string
	// Device follows the parent's slowdown changes (via the control file).
	// Pauses are real SIGSTOPs, so its gate stays open.
	Device *Device
	// Metrics is flushed to the parent by Flush.
	Metrics     *Recorder
	metricsPath string
}

// ChildFromEnv reads the environment a Processes launcher sets. It returns
// (nil, nil) when the process was not launched by a swarm.
func ChildFromEnv() (*Child, error) {
	name := os.Getenv(EnvName)
	if name == "" {
		return nil, nil
	}
	idx, err := strconv.Atoi(os.Getenv(EnvIndex))
	if err != nil {
		return nil, fmt.Errorf("swarm: %s: %w", EnvIndex, err)
	}
	slow, err := strconv.ParseFloat(os.Getenv(EnvSlowdown), 64)
	if err != nil {
		return nil, fmt.Errorf("swarm: %s: %w", EnvSlowdown, err)
	}
	mem, err := strconv.ParseInt(os.Getenv(EnvMemory), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("swarm: %s: %w", EnvMemory, err)
	}
	dev, err := NewDevice(os.Getenv(EnvClass), slow, mem)
	if err != nil {
		return nil, err
	}
	dev.control = os.Getenv(EnvControl)
	return &Child{
		Index: idx, Name: name, Class: os.Getenv(EnvClass), Region: os.Getenv(EnvRegion),
		Device: dev, Metrics: NewRecorder(), metricsPath: os.Getenv(EnvMetrics),
	}, nil
}

// Flush writes the metrics where the parent swarm reads them. Call it
// periodically and before exiting; a killed child reports its last flush.
func (c *Child) Flush() error {
	if c.metricsPath == "" {
		return errors.New("swarm: no metrics file in the environment")
	}
	return c.Metrics.WriteFile(c.metricsPath)
}
