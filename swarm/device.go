package swarm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/skyhive/skyhive/clock"
)

// Device is a peer's emulated machine: a compute slowdown factor, a memory
// cap and a pause gate. Peers call Throttle after each piece of compute and
// Checkpoint at safe points; both block while the device is paused. All
// methods are safe for concurrent use.
type Device struct {
	name   string
	memory int64
	clk    clock.Clock

	mu       sync.Mutex
	slowdown float64
	gate     chan struct{} // closed while running; open (blocking) while paused

	// In a child process, the slowdown is re-read from this file (written
	// by the parent swarm) at most every controlPoll.
	control   string
	lastCheck time.Time
}

const controlPoll = 100 * time.Millisecond

// DeviceOption configures NewDevice.
type DeviceOption func(*Device)

// WithClock makes the device throttle on c instead of the wall clock (nil
// means the wall clock).
func WithClock(c clock.Clock) DeviceOption { return func(d *Device) { d.clk = clock.Or(c) } }

// NewDevice returns a running device. slowdown must be at least 1 (1 is
// full speed); memoryBytes is the memory cap (0 means none). It runs on the
// wall clock unless WithClock says otherwise.
func NewDevice(name string, slowdown float64, memoryBytes int64, opts ...DeviceOption) (*Device, error) {
	if err := checkSlowdown(slowdown); err != nil {
		return nil, err
	}
	if memoryBytes < 0 {
		return nil, fmt.Errorf("swarm: device %s: negative memory cap %d", name, memoryBytes)
	}
	g := make(chan struct{})
	close(g)
	d := &Device{name: name, memory: memoryBytes, clk: clock.Real(), slowdown: slowdown, gate: g}
	for _, o := range opts {
		o(d)
	}
	return d, nil
}

func checkSlowdown(f float64) error {
	if !(f >= 1) || math.IsInf(f, 0) {
		return fmt.Errorf("swarm: slowdown %v must be a finite number >= 1", f)
	}
	return nil
}

// Name is the device class name.
func (d *Device) Name() string { return d.name }

// MemoryBytes is the memory cap in bytes, 0 if none. Goroutine peers must
// respect it themselves; child processes also get it as GOMEMLIMIT.
func (d *Device) MemoryBytes() int64 { return d.memory }

// Slowdown returns the current slowdown factor.
func (d *Device) Slowdown() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refreshLocked()
	return d.slowdown
}

// SetSlowdown changes the slowdown factor (at least 1).
func (d *Device) SetSlowdown(f float64) error {
	if err := checkSlowdown(f); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.slowdown = f
	return nil
}

// Pause closes the gate: Throttle and Checkpoint block until Resume.
func (d *Device) Pause() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.gate:
		d.gate = make(chan struct{})
	default: // already paused
	}
}

// Resume reopens the gate.
func (d *Device) Resume() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.gate:
	default:
		close(d.gate)
	}
}

// Paused reports whether the gate is closed.
func (d *Device) Paused() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.gate:
		return false
	default:
		return true
	}
}

// Checkpoint blocks while the device is paused; it returns ctx's error if
// ctx ends first.
func (d *Device) Checkpoint(ctx context.Context) error {
	d.mu.Lock()
	g := d.gate
	d.mu.Unlock()
	select {
	case <-g:
		return ctx.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Throttle emulates a slower device after compute that took
// computeDuration on this machine: it sleeps (slowdown-1)×computeDuration
// on the device's clock, and waits at the pause gate before and after.
func (d *Device) Throttle(ctx context.Context, computeDuration time.Duration) error {
	if err := d.Checkpoint(ctx); err != nil {
		return err
	}
	extra := time.Duration((d.Slowdown() - 1) * float64(computeDuration))
	if extra > 0 {
		if err := d.clk.Sleep(ctx, extra); err != nil {
			return err
		}
	}
	return d.Checkpoint(ctx)
}

// refreshLocked re-reads the control file of a child process.
func (d *Device) refreshLocked() {
	if d.control == "" || d.clk.Now().Sub(d.lastCheck) < controlPoll {
		return
	}
	d.lastCheck = d.clk.Now()
	data, err := os.ReadFile(d.control)
	if err != nil {
		return
	}
	if f, err := strconv.ParseFloat(strings.TrimSpace(string(data)), 64); err == nil && checkSlowdown(f) == nil {
		d.slowdown = f
	}
}

// writeControl atomically writes a slowdown factor for a child process.
func writeControl(path string, f float64) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".control-*")
	if err != nil {
		return fmt.Errorf("swarm: control file: %w", err)
	}
	_, werr := tmp.WriteString(strconv.FormatFloat(f, 'g', -1, 64) + "\n")
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("swarm: control file: %w", errors.Join(werr, cerr))
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("swarm: control file: %w", err)
	}
	return nil
}
