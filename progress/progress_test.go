package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestPlainOutputEveryAndFinal(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "train", 20)
	clock := b.start
	b.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	for i := 1; i <= 20; i++ {
		b.Update(i, int64(i*10), F("loss", 0.5))
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 10 {
		t.Fatalf("want a line every 2 steps (10 lines), got %d:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "2/20") || !strings.Contains(lines[0], "loss=0.5") || !strings.Contains(lines[0], "eta 18s") {
		t.Errorf("first line %q lacks step, loss or eta", lines[0])
	}
	if !strings.Contains(lines[9], "100%") || !strings.Contains(lines[9], "10/s") {
		t.Errorf("last line %q lacks 100%% or throughput", lines[9])
	}
}
