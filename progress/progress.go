// Package progress draws a one-line progress bar with loss, throughput and
// ETA for long-running work such as training.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Bar reports progress of a task with a known number of steps. On a terminal
// it redraws one line; otherwise it prints a line every Every steps and at the
// end, so logs stay readable. A Bar is not safe for concurrent use.
type Bar struct {
	w        io.Writer
	total    int
	label    string
	start    time.Time
	lastDraw time.Time
	tty      bool
	// Every is the step interval of plain-line output when not on a terminal.
	Every int
	now   func() time.Time
}

// New returns a bar for total steps writing to w.
func New(w io.Writer, label string, total int) *Bar {
	b := &Bar{w: w, total: total, label: label, now: time.Now, Every: max(1, total/10)}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			b.tty = true
		}
	}
	b.start = b.now()
	return b
}

// Update reports that step (1-based) of total is done; items is the number of
// samples processed so far, used for throughput; fields are extra key=value
// pairs such as the loss.
func (b *Bar) Update(step int, items int64, fields ...Field) {
	now := b.now()
	final := step >= b.total
	if b.tty {
		if !final && now.Sub(b.lastDraw) < 100*time.Millisecond {
			return
		}
	} else if !final && step%b.Every != 0 {
		return
	}
	b.lastDraw = now
	line := b.render(step, items, now, fields)
	if b.tty {
		fmt.Fprintf(b.w, "\r\x1b[K%s", line)
		if final {
			fmt.Fprintln(b.w)
		}
	} else {
		fmt.Fprintln(b.w, line)
	}
}

// Field is one key=value pair shown on the bar.
type Field struct {
	Key   string
	Value float64
}

// F makes a Field.
func F(key string, v float64) Field { return Field{key, v} }

func (b *Bar) render(step int, items int64, now time.Time, fields []Field) string {
	const width = 24
	frac := 1.0
	if b.total > 0 {
		frac = min(1, float64(step)/float64(b.total))
	}
	filled := int(frac * width)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s [%s%s] %3.0f%% %d/%d", b.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), 100*frac, step, b.total)
	for _, f := range fields {
		fmt.Fprintf(&sb, " %s=%.4g", f.Key, f.Value)
	}
	el := now.Sub(b.start)
	if secs := el.Seconds(); secs > 0 && items > 0 {
		fmt.Fprintf(&sb, " %.0f/s", float64(items)/secs)
	}
	if step > 0 && step < b.total {
		eta := time.Duration(float64(el) / float64(step) * float64(b.total-step))
		fmt.Fprintf(&sb, " eta %s", eta.Round(time.Second))
	} else {
		fmt.Fprintf(&sb, " %s", el.Round(100*time.Millisecond))
	}
	return sb.String()
}
