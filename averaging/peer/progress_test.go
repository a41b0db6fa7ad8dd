package peer

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging/optimizer"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader in
// different goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The progress lines read each peer's stats file: its steps, the
// averages it took part in, its latest evaluation and whether it is done;
// a peer without stats yet is starting.
func TestProgressLine(t *testing.T) {
	dir := t.TempDir()
	write := func(i int, snaps ...Snapshot) {
		var b []byte
		for _, s := range snaps {
			line, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			b = append(append(b, line...), '\n')
		}
		if err := os.WriteFile(StatsFile(dir, i), append(b, `{"half a li`...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(0, Snapshot{Stats: optimizer.Stats{Steps: 10, Groups: 1}, Accuracy: 0.5},
		Snapshot{Stats: optimizer.Stats{Steps: 42, Groups: 3, GlobalSyncs: 1}, Accuracy: 0.712})
	write(1, Snapshot{Stats: optimizer.Stats{Steps: 60, GlobalSyncs: 60}, Perplexity: 123.456, Final: &Result{}})
	got := progressLine(dir, 3)
	want := "peer0 42 steps, 4 groups, accuracy 71.2%; peer1 60 steps, 60 groups, perplexity 123.46, done; peer2 starting"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}

	var log lockedBuffer
	stop := watchProgress(&log, 10*time.Millisecond, time.Now(), dir, 3)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), want) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if !strings.Contains(log.String(), want) {
		t.Errorf("no progress line in %q", log.String())
	}
	n := len(log.String())
	time.Sleep(30 * time.Millisecond)
	if len(log.String()) != n {
		t.Error("progress lines after stop")
	}
}
