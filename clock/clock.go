// Package clock holds the context-aware waits every package shares.
package clock

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx ends, whichever is first; it returns
// ctx's error if ctx ended (also when d <= 0 and ctx has already ended).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SleepUntil waits until t or until ctx ends, whichever is first.
func SleepUntil(ctx context.Context, t time.Time) error { return Sleep(ctx, time.Until(t)) }
