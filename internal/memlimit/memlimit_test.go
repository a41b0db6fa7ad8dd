package memlimit

import (
	"math"
	"testing"
)

func TestParse(t *testing.T) {
	if b, ok := vmSize("Name:\tskyhive\nVmPeak:\t 2000 kB\nVmSize:\t 1808916 kB\n"); !ok || b != 1808916<<10 {
		t.Errorf("vmSize = %d, %v", b, ok)
	}
	if _, ok := vmSize("Name:\tx\n"); ok {
		t.Error("vmSize without the line")
	}
	if p, ok := cgroupPath("0::/system.slice/x.service\n"); !ok || p != "/system.slice/x.service" {
		t.Errorf("cgroupPath = %q, %v", p, ok)
	}
	if _, ok := cgroupPath("1:memory:/x\n"); ok {
		t.Error("a cgroup v1 line taken for v2")
	}
	for in, want := range map[string]int64{"max\n": math.MaxInt64, "4000000000\n": 4000000000} {
		if b, ok := parseBytes(in); !ok || b != want {
			t.Errorf("parseBytes(%q) = %d, %v", in, b, ok)
		}
	}
	for _, in := range []string{"", "-1", "lots"} {
		if _, ok := parseBytes(in); ok {
			t.Errorf("parseBytes(%q) accepted", in)
		}
	}
}

func TestHeapAndCombine(t *testing.T) {
	as := Limit{Bytes: 2 << 30, Source: "address space (RLIMIT_AS)", Reserve: NonHeapReserve}
	cg := Limit{Bytes: 1700 << 20, Source: "cgroup memory.max"}
	if as.Heap() != 2<<30-NonHeapReserve || cg.Heap() != 1700<<20 || (Limit{}).Heap() != 0 {
		t.Fatalf("heaps %d %d", as.Heap(), cg.Heap())
	}
	// The address space leaves 1.5 GiB to the heap, the cgroup 1.66.
	if got := combine(as, cg); got != as {
		t.Errorf("combine = %+v, want the address space", got)
	}
	if got := combine(Limit{}, cg); got != cg {
		t.Errorf("combine without RLIMIT_AS = %+v", got)
	}
	if Min(0, 5) != 5 || Min(7, 0) != 7 || Min(7, 5) != 5 {
		t.Error("Min")
	}
}
