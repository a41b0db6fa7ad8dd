package server

import "fmt"

// MemoryPlan divides a process's memory budget among an expert server's
// parts, so that no mix of admitted requests can exceed it: the experts'
// weights and optimizer state, the requests the host reads at once
// (p2p.Config.RequestMemory), the queued and running requests' tensors
// (QueueMemory, counted three times: the request's bytes, the decoded
// tensors and a batch's copy), the working memory of the batches running
// at once (Workers × RequestMemory), and a quarter left to the runtime
// and to garbage not yet collected (Go's soft memory limit, set to the
// budget, makes the collector reclaim finished batches before the heap
// passes it).
type MemoryPlan struct {
	// Budget is the whole budget; Experts the weights' share.
	Budget, Experts int64
	// Requests bounds the requests the host reads or handles at once.
	Requests int64
	// Queue bounds QueueMemory, Work the working memory of all running
	// batches (RequestMemory is at most Work / Workers).
	Queue, Work int64
}

// minPlanBytes is the least a plan must leave beyond the experts.
const minPlanBytes = 64 << 20

// PlanMemory plans a budget of bytes for experts that take expertBytes
// (weights, gradients and AdamW's moments: see ExpertParams).
func PlanMemory(budget, expertBytes int64) (MemoryPlan, error) {
	rest := budget - expertBytes
	if rest < minPlanBytes {
		return MemoryPlan{}, fmt.Errorf("a memory budget of %d MiB leaves %d MiB beside the experts' %d MiB; at least %d MiB are needed for requests: host fewer or smaller experts, or give the process more memory",
			budget>>20, max(rest, 0)>>20, expertBytes>>20, minPlanBytes>>20)
	}
	return MemoryPlan{Budget: budget, Experts: expertBytes, Requests: rest / 4, Queue: rest / 12, Work: rest / 4}, nil
}

// String describes the plan for the server's start-up line.
func (p MemoryPlan) String() string {
	return fmt.Sprintf("memory budget %d MiB: experts %d, requests being read %d, queued tensors %d, working memory %d MiB",
		p.Budget>>20, p.Experts>>20, p.Requests>>20, p.Queue>>20, p.Work>>20)
}
