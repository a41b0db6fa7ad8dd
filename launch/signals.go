package launch

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// ForcedExit is the exit status of a process that a second signal
// stopped: 128 + SIGINT, as a shell reports a process that Ctrl-C killed.
const ForcedExit = 130

// HandleSignals turns the first SIGINT or SIGTERM on sigs into a clean stop
// (cancel: every long-running role then stops within a couple of seconds,
// checkpointing what it must) and a second one into an immediate exit
// (exit(ForcedExit)), saying so on w. It returns when sigs is closed.
func HandleSignals(sigs <-chan os.Signal, cancel context.CancelFunc, w io.Writer, exit func(int)) {
	s, ok := <-sigs
	if !ok {
		return
	}
	fmt.Fprintf(w, "skyhive: %v: stopping (send it again to stop at once)\n", s)
	cancel()
	if s, ok = <-sigs; ok {
		fmt.Fprintf(w, "skyhive: %v again: exiting now\n", s)
		exit(ForcedExit)
	}
}

// WatchSignals returns a context that the process's first SIGINT or
// SIGTERM cancels, with the second one exiting at once (HandleSignals,
// saying so on w), and the function that stops watching, cancels the
// context and reports whether a signal had cancelled it.
func WatchSignals(parent context.Context, w io.Writer, exit func(int)) (ctx context.Context, stop func() (signalled bool)) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		HandleSignals(sigs, cancel, w, exit)
		close(done)
	}()
	return ctx, func() bool {
		signal.Stop(sigs)
		signalled := ctx.Err() != nil && parent.Err() == nil
		cancel()
		close(sigs) // no more deliveries after Stop: the handler returns
		<-done
		return signalled
	}
}
