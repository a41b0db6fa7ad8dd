package p2p

import (
	"sync"
	"time"
)

// limitedLogs is how many warnings of one kind a host logs per minute.
const limitedLogs = 10

// logLimit rate-limits the warnings a remote peer can provoke (one per
// oversized request, per refused stranger, ...), so that a hostile peer
// cannot flood the log: per kind, at most limitedLogs a minute pass; the
// others are counted and the count goes out with the next one that
// passes. The zero value is ready to use.
type logLimit struct {
	mu    sync.Mutex
	kinds map[string]*logWindow
}

type logWindow struct {
	start      time.Time
	n          int
	suppressed int
}

// allow says whether a warning of kind may be logged at now and, if so,
// how many of its kind were suppressed since the last one logged.
func (l *logLimit) allow(kind string, now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kinds == nil {
		l.kinds = map[string]*logWindow{}
	}
	w := l.kinds[kind]
	if w == nil {
		w = &logWindow{start: now}
		l.kinds[kind] = w
	}
	if now.Sub(w.start) >= time.Minute {
		w.start, w.n = now, 0
	}
	if w.n >= limitedLogs {
		w.suppressed++
		return false, 0
	}
	w.n++
	suppressed, w.suppressed = w.suppressed, 0
	return true, suppressed
}

// warnPeer logs a warning a remote peer provoked, rate-limited by msg
// (the kinds are this package's constant messages).
func (h *Host) warnPeer(msg string, args ...any) {
	ok, suppressed := h.logs.allow(msg, time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	h.log.Warn(msg, args...)
}
