//go:build !linux

package pipeline

// readThreadTimes is unavailable outside Linux; ops then count their wall
// time as busy.
func readThreadTimes() (threadTimes, bool) { return threadTimes{}, false }
