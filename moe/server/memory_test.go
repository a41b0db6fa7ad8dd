package server

import (
	"strings"
	"testing"
)

// A memory budget lowers the per-request and queue budgets so that the
// experts, the requests being read, the queued tensors (three copies), the
// running batches and a quarter for the runtime add up to it; experts that
// leave no room are refused with what to do.
func TestMemoryBudgetPlansTheServer(t *testing.T) {
	e := newEnv(t)
	const budget = 1600 << 20
	experts := expertBytes(2, TypeTransformer, 256)
	p, err := PlanMemory(budget, experts)
	if err != nil {
		t.Fatal(err)
	}
	if sum := p.Experts + p.Requests + 3*p.Queue + p.Work; sum > budget-budget/5 {
		t.Fatalf("plan %+v takes %d of %d bytes, leaving under a fifth to the runtime", p, sum, budget)
	}
	cfg := Config{Transport: e.srv, Experts: []string{"t.0", "t.1"}, Type: TypeTransformer, Hidden: 256, MemoryBudget: budget, Workers: 2}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.RequestMemory != p.Work/2 || cfg.QueueMemory != p.Queue {
		t.Fatalf("request memory %d, queue %d; want %d and %d", cfg.RequestMemory, cfg.QueueMemory, p.Work/2, p.Queue)
	}
	// Without a budget the defaults stand.
	free := Config{Transport: e.srv, Experts: []string{"t.0"}, Type: TypeTransformer, Hidden: 256}
	if err := free.defaults(); err != nil || free.RequestMemory < DefaultRequestMemory || free.QueueMemory != DefaultQueueMemory {
		t.Fatalf("defaults without a budget: %v, %d, %d", err, free.RequestMemory, free.QueueMemory)
	}
	big := Config{Transport: e.srv, Experts: []string{"t.0", "t.1"}, Type: TypeTransformer, Hidden: 256, MemoryBudget: experts + 10<<20}
	if err := big.defaults(); err == nil || !strings.Contains(err.Error(), "fewer or smaller experts") {
		t.Fatalf("experts that leave 10 MiB: %v", err)
	}
}
