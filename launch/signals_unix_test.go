//go:build unix

package launch

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"
)

// WatchSignals' context ends at the process's first SIGTERM, and stop says
// so; without a signal, stop says none came.
func TestWatchSignals(t *testing.T) {
	exit := func(code int) { t.Errorf("exit(%d) after one signal", code) }
	var out bytes.Buffer // read once stop has returned
	_, stop := WatchSignals(context.Background(), &out, exit)
	if stop() {
		t.Error("signalled without a signal")
	}
	ctx, stop := WatchSignals(context.Background(), &out, exit)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not cancel the context")
	}
	if !stop() || !bytes.Contains(out.Bytes(), []byte("stopping")) {
		t.Errorf("not signalled, or the handler said %q", out.String())
	}
}
