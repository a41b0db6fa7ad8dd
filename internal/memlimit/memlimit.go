// Package memlimit finds how much more memory this process may use before
// the kernel refuses it: the address-space limit (RLIMIT_AS, which
// `prlimit --as` and `ulimit -v` set) less the address space the process
// has mapped already, and its cgroup's memory.max less what the cgroup
// uses. Roles size their budgets, and Go's soft memory limit, from it.
package memlimit

import (
	"bufio"
	"math"
	"strconv"
	"strings"
)

// Limit is the memory this process may still take, and what bounds it.
type Limit struct {
	// Bytes is what is left (0: no limit found).
	Bytes int64
	// Source names the limit: "address space (RLIMIT_AS)" or "cgroup
	// memory.max".
	Source string
	// Reserve is what the limit must leave to memory that is not Go's
	// heap (NonHeapReserve for an address-space limit, which counts
	// every mapping; 0 for a cgroup's, which counts pages in use).
	Reserve int64
}

// NonHeapReserve is what an address-space limit must leave to memory
// that is not Go's heap but grows with the process: thread stacks and the
// C allocator's per-thread arenas (64 MiB of address space each) of the
// threads a BLAS library or the runtime starts later.
const NonHeapReserve = 512 << 20

// Heap returns the bytes Go's heap may grow to within l: what l leaves,
// less its Reserve; 0 when there is no limit, and at least 1 when there
// is one.
func (l Limit) Heap() int64 {
	if l.Bytes <= 0 {
		return 0
	}
	return max(l.Bytes-l.Reserve, 1)
}

// Min returns the smaller of two budgets, where 0 is none.
func Min(a, b int64) int64 {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

// vmSize parses the VmSize line of /proc/self/status into bytes.
func vmSize(status string) (int64, bool) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "VmSize:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return kb << 10, err == nil
	}
	return 0, false
}

// cgroupPath returns the cgroup v2 path in /proc/self/cgroup's text.
func cgroupPath(text string) (string, bool) {
	for line := range strings.Lines(text) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return p, true
		}
	}
	return "", false
}

// parseBytes parses a cgroup memory file: a number of bytes or "max".
func parseBytes(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return math.MaxInt64, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// combine is the tighter of an address-space and a cgroup limit (each
// left as {0, ""} when absent).
func combine(as, cg Limit) Limit {
	switch {
	case as.Bytes <= 0:
		return cg
	case cg.Bytes <= 0 || as.Heap() <= cg.Heap():
		return as
	}
	return cg
}
