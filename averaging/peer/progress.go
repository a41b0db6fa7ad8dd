package peer

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// watchProgress writes a line with the progress of the peers Launch runs
// in dir to w every interval, until the returned stop is called (nil w:
// none).
func watchProgress(w io.Writer, every time.Duration, start time.Time, dir string, peers int) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				logf(w, "  %s: %s", time.Since(start).Round(time.Second), progressLine(dir, peers))
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// progressLine describes each peer's progress from its stats file:
// "peer0 120 steps, 14 groups, accuracy 71.3%; peer1 ...".
func progressLine(dir string, peers int) string {
	parts := make([]string, peers)
	for i := range peers {
		parts[i] = "peer" + strconv.Itoa(i) + " " + peerProgress(StatsFile(dir, i))
	}
	return strings.Join(parts, "; ")
}

// peerProgress is one peer's part of progressLine: its steps and the
// averages it took part in (groups and global ones) from the last line of
// its stats file, and its latest evaluation; "starting" before the first
// line.
func peerProgress(path string) string {
	snaps, err := ReadSnapshots(path)
	if err != nil || len(snaps) == 0 {
		return "starting"
	}
	last := snaps[len(snaps)-1]
	s := fmt.Sprintf("%d steps, %d groups", last.Stats.Steps, last.Stats.Groups+last.Stats.GlobalSyncs)
	switch {
	case last.Perplexity > 0:
		s += fmt.Sprintf(", perplexity %.2f", last.Perplexity)
	case last.Accuracy > 0:
		s += fmt.Sprintf(", accuracy %.1f%%", 100*last.Accuracy)
	}
	if last.Final != nil {
		s += ", done"
	}
	return s
}

// formatSlowdowns lists slowdowns as "1.4 1.9 1.1".
func formatSlowdowns(slow []float64) string {
	parts := make([]string, len(slow))
	for i, v := range slow {
		parts[i] = strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strings.Join(parts, " ")
}
