package bridge

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// region is the shared memory of a session: a sealed memfd mapped into the
// daemon, holding float32 elements. The seals forbid shrinking and
// growing, so a client holding the descriptor cannot make the daemon's
// mapping fault.
type region struct {
	fd  int
	mem []byte
}

// newRegion creates and maps a region of n float32 elements.
func newRegion(n int) (*region, error) {
	size := 4 * n
	fd, err := unix.MemfdCreate("skyhive-tensors", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("bridge: shared memory: %w", err)
	}
	r := &region{fd: fd}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		r.close()
		return nil, fmt.Errorf("bridge: shared memory of %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		r.close()
		return nil, fmt.Errorf("bridge: seal shared memory: %w", err)
	}
	if r.mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		r.close()
		return nil, fmt.Errorf("bridge: map shared memory of %d bytes: %w", size, err)
	}
	return r, nil
}

// floats returns the n elements from element off as a slice over the
// mapping.
func (r *region) floats(off, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&r.mem[4*off])), n)
}

// close unmaps the region and closes its descriptor.
func (r *region) close() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}
