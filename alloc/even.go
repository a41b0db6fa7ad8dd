package alloc

import (
	"context"
	"fmt"
	"time"
)

// Even is the paper's baseline: layers are split evenly over the devices in
// their given order, the first L mod n devices getting one layer more.
//
// Even ignores memory, as the paper's baseline does. If the cluster as a
// whole cannot hold the model it returns a *MemoryError; otherwise it
// returns its plan even when some devices are over their memory, and says
// so in Result.Notes and Report.OverMemBytes (such a plan would run out of
// memory on real devices).
type Even struct{}

// Name returns "even".
func (Even) Name() string { return "even" }

// Solve splits the layers evenly.
func (e Even) Solve(_ context.Context, p Problem) (*Result, error) {
	start := time.Now()
	in, err := compileFitting(p)
	if err != nil {
		return nil, err
	}
	bounds := evenBounds(in.n, in.L)
	order := make([]int, in.n)
	for i := range order {
		order[i] = i
	}
	res, err := finish(e.Name(), p, planFromBounds(order, bounds), start)
	if err != nil {
		return nil, err
	}
	if over := res.Report.OverMemBytes; over > 0 {
		n := 0
		for _, s := range res.Report.Stages {
			if s.MemBytes > s.MemCap {
				n++
			}
		}
		res.Notes = append(res.Notes, fmt.Sprintf("over memory on %d devices by %s in total", n, GiB(over)))
	}
	return res, nil
}

// evenBounds returns the paper's even partition indices of L layers over n
// devices (len n+1).
func evenBounds(n, L int) []int {
	b := make([]int, n+1)
	avg, rem := L/n, L%n
	for i := 0; i < n; i++ {
		k := avg
		if i < rem {
			k++
		}
		b[i+1] = b[i] + k
	}
	return b
}
