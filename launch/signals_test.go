package launch

import (
	"bytes"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The first signal cancels the role's context, the second exits at once.
func TestSignalSecondForcesExit(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	var out bytes.Buffer // read once the handler is done
	done := make(chan struct{})
	go func() {
		HandleSignals(sigs, cancel, &out, func(code int) { exited <- code })
		close(done)
	}()
	sigs <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the first signal did not cancel the context")
	}
	select {
	case code := <-exited:
		t.Fatalf("exit(%d) after the first signal", code)
	case <-time.After(50 * time.Millisecond):
	}
	sigs <- os.Interrupt
	select {
	case code := <-exited:
		if code != ForcedExit {
			t.Fatalf("exit(%d), want %d", code, ForcedExit)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second signal did not force an exit")
	}
	close(sigs)
	<-done
	if !strings.Contains(out.String(), "stopping") || !strings.Contains(out.String(), "exiting now") {
		t.Fatalf("the handler said %q", out.String())
	}
}
