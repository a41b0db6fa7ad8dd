//go:build linux

package pipeline

import (
	"syscall"
	"time"
	"unsafe"
)

const (
	// clockThreadCPUTime is Linux's CLOCK_THREAD_CPUTIME_ID.
	clockThreadCPUTime = 3
	// rusageThread is Linux's RUSAGE_THREAD.
	rusageThread = 1
	// threadSchedstat is the calling thread's scheduler statistics: time
	// on a CPU, time waiting on a run queue (both in ns) and time slices.
	threadSchedstat = "/proc/thread-self/schedstat"
)

// readThreadTimes reads the calling OS thread's clocks, and false if the
// kernel does not provide them. Callers lock the goroutine to its thread
// around the measured section.
func readThreadTimes() (threadTimes, bool) {
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return threadTimes{}, false
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return threadTimes{}, false
	}
	fd, err := syscall.Open(threadSchedstat, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return threadTimes{}, false
	}
	var buf [128]byte
	n, err := syscall.Read(fd, buf[:])
	syscall.Close(fd)
	if err != nil || n <= 0 {
		return threadTimes{}, false
	}
	waited, ok := parseRunDelay(buf[:n])
	return threadTimes{cpu: time.Duration(ts.Nano()), waited: waited, blocked: ru.Nvcsw}, ok
}
