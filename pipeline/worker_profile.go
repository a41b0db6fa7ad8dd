package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/stats"
	"github.com/skyhive/skyhive/tensor"
)

// onProfile times forward and backward of every layer of the whole model:
// at req.Batch with the emulated slowdown (the device's speed), and
// without it at each req.Calibrate size (the layers' relative costs), and
// one optimizer step. Layer times are busy times (see opClock; medians
// over the repetitions), so other processes' use of the cores does not
// leak into them.
func (w *Worker) onProfile(ctx context.Context, b []byte) ([]byte, error) {
	var req profileReq
	if err := decodeHeader(b, &req); err != nil {
		return nil, err
	}
	if req.Batch < 1 || req.Batch > maxBatch || req.Reps < 1 || req.Reps > 50 || len(req.Calibrate) > 4 {
		return nil, fmt.Errorf("pipeline: bad profile request %+v", req)
	}
	for _, n := range req.Calibrate {
		if n < 1 || n > maxBatch {
			return nil, fmt.Errorf("pipeline: bad profile batch %d", n)
		}
	}
	if req.Optim.Kind != "" || req.Optim.LR != 0 {
		if err := req.Optim.Validate(); err != nil {
			return nil, err
		}
	}
	model, info, err := buildModel(req.Model, req.Seed)
	if err != nil {
		return nil, err
	}
	if model.Len() > maxLayers {
		return nil, fmt.Errorf("pipeline: model of %d layers, at most %d", model.Len(), maxLayers)
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	resp := profileResp{}
	// The device: whole-model passes at req.Batch, each followed by the
	// emulated slowdown.
	var times, busys, overs []float64
	after := func(wall, busy time.Duration) {
		t0 := time.Now()
		w.throttle(ctx, wall, busy)
		slept := time.Since(t0)
		times = append(times, (wall + slept).Seconds())
		busys = append(busys, busy.Seconds())
		// How late the emulated op ended: timer and scheduling delays.
		target := max(time.Duration(w.dev.Slowdown()*float64(busy)), wall)
		overs = append(overs, max(wall+slept-target, 0).Seconds())
	}
	if w.cfg.Executor != nil {
		if err := w.profileExec(ctx, req, model, info, &resp, after); err != nil {
			return nil, err
		}
		resp.Seconds, resp.CPU, resp.Overshoot = stats.Median(times), stats.Median(busys), stats.Median(overs)
		resp.FLOPS = model.Cost(append([]int{req.Batch}, info.Input...)).TotalFLOPs() / resp.Seconds
		return encodeMsg(resp, nil)
	}
	if _, _, err = w.timeLayers(ctx, model, info, req.Seed, req.Batch, req.Reps, after); err != nil {
		return nil, err
	}
	resp.Seconds, resp.CPU, resp.Overshoot = stats.Median(times), stats.Median(busys), stats.Median(overs)
	resp.FLOPS = model.Cost(append([]int{req.Batch}, info.Input...)).TotalFLOPs() / resp.Seconds
	for _, n := range req.Calibrate {
		fwd, bwd, err := w.timeLayers(ctx, model, info, req.Seed, n, req.Reps, nil)
		if err != nil {
			return nil, err
		}
		resp.Fwd, resp.Bwd = append(resp.Fwd, fwd), append(resp.Bwd, bwd)
	}
	if req.Optim.LR > 0 {
		params := model.Params()
		opt := req.Optim.NewOptimizer(params)
		var steps []float64
		for i := range req.Reps + 1 {
			c := startOp()
			opt.Step()
			_, busy := c.stop()
			if i > 0 {
				steps = append(steps, busy.Seconds())
			}
		}
		n := 0
		for _, p := range params {
			n += p.Value.Len()
		}
		resp.OptimPerParam = stats.Median(steps) / float64(max(n, 1))
	}
	return encodeMsg(resp, nil)
}

// timeLayers runs forward and backward of model on a batch of n random
// examples reps+1 times (the first warms up) and returns each layer's
// median forward and backward busy seconds. after, if set, is called
// after every pass with its wall and busy time.
func (w *Worker) timeLayers(ctx context.Context, model *nn.Sequential, info ModelInfo, seed uint64, n, reps int, after func(wall, busy time.Duration)) (fwd, bwd []float64, err error) {
	x, y := profileBatch(info, seed, n)
	layers := model.Layers()
	fs := make([][]float64, len(layers))
	bs := make([][]float64, len(layers))
	states := make([]nn.State, len(layers))
	for rep := range reps + 1 {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		var wall, busy time.Duration
		h := x
		for i, l := range layers {
			c := startOp()
			h, states[i] = l.Module.Forward(nn.Ctx{Train: true}, h)
			dw, dc := c.stop()
			wall, busy = wall+dw, busy+dc
			if rep > 0 {
				fs[i] = append(fs[i], dc.Seconds())
			}
		}
		c := startOp()
		var dy *tensor.Tensor
		if info.lm() {
			_, dy = nn.SequenceCrossEntropy(h, y)
		} else {
			_, dy = nn.SoftmaxCrossEntropy(h, y)
		}
		dw, dc := c.stop()
		wall, busy = wall+dw, busy+dc
		for i := len(layers) - 1; i >= 0 && dy != nil; i-- {
			c := startOp()
			dy = layers[i].Module.Backward(states[i], dy)
			dw, dc := c.stop()
			wall, busy = wall+dw, busy+dc
			if rep > 0 {
				bs[i] = append(bs[i], dc.Seconds())
			}
		}
		if rep > 0 && after != nil {
			after(wall, busy)
		}
	}
	fwd, bwd = make([]float64, len(layers)), make([]float64, len(layers))
	for i := range layers {
		fwd[i], bwd[i] = stats.Median(fs[i]), stats.Median(bs[i])
	}
	return fwd, bwd, nil
}
