package optimizer

// outerOf returns the outer optimization of a DiLoCo, Streaming DiLoCo or
// WA-DiLoCo optimizer.
func outerOf(o *Optimizer) *outer {
	switch a := o.alg.(type) {
	case *diloco:
		return a.outer
	case *streaming:
		return a.outer
	case *waDiLoCo:
		return a.outer
	}
	panic("not a DiLoCo optimizer")
}

// waOf returns the algorithm of a WA-DiLoCo optimizer.
func waOf(o *Optimizer) *waDiLoCo { return o.alg.(*waDiLoCo) }
