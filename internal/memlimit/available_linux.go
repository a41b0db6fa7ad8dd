//go:build linux

package memlimit

import (
	"os"
	"path/filepath"
	"syscall"
)

// Available is the memory this process may still take (see Limit).
func Available() Limit {
	return combine(addressSpace(), cgroup())
}

func addressSpace() Limit {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &r); err != nil || r.Cur == ^uint64(0) || r.Cur > 1<<62 {
		return Limit{}
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return Limit{}
	}
	used, ok := vmSize(string(status))
	if !ok {
		return Limit{}
	}
	return Limit{Bytes: max(int64(r.Cur)-used, 1), Source: "address space (RLIMIT_AS)", Reserve: NonHeapReserve}
}

func cgroup() Limit {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return Limit{}
	}
	p, ok := cgroupPath(string(self))
	if !ok {
		return Limit{}
	}
	dir := filepath.Join("/sys/fs/cgroup", filepath.Clean("/"+p))
	maxText, err1 := os.ReadFile(filepath.Join(dir, "memory.max"))
	curText, err2 := os.ReadFile(filepath.Join(dir, "memory.current"))
	if err1 != nil || err2 != nil {
		return Limit{}
	}
	limit, ok1 := parseBytes(string(maxText))
	cur, ok2 := parseBytes(string(curText))
	if !ok1 || !ok2 || limit == 1<<63-1 {
		return Limit{}
	}
	return Limit{Bytes: max(limit-cur, 1), Source: "cgroup memory.max"}
}
