package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("zero wait on an ended context: %v", err)
	}
	if err := Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if err := SleepUntil(context.Background(), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
}
