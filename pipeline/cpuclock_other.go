//go:build !linux

package pipeline

import "time"

// threadCPU is unavailable outside Linux; callers fall back to wall time.
func threadCPU() (time.Duration, bool) { return 0, false }
