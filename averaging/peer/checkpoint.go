// Checkpoints of a peer: model, optimizer state and counters in one
// safetensors file, written atomically.

package peer

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/tensor"
)

// Checkpoint metadata keys.
const (
	metaModel = "skyhive.model"
	metaRound = "skyhive.round"
	metaStep  = "skyhive.optim_step"
	metaEpoch = "skyhive.epoch"
)

// save writes the peer's state atomically (no-op without a checkpoint).
func (t *trainer) save() error {
	if t.cfg.Checkpoint == "" {
		return nil
	}
	st := t.opt.ExportState()
	tensors := map[string]*tensor.Tensor{"state": tensor.FromSlice(st.Vector, len(st.Vector))}
	meta := map[string]string{
		metaModel: t.opt.ModelSignature(),
		metaRound: strconv.Itoa(st.Round),
		metaStep:  strconv.Itoa(st.OptStep),
		metaEpoch: strconv.Itoa(st.Epoch),
	}
	if err := checkpoint.Save(t.cfg.Checkpoint, tensors, meta); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// resume loads the checkpoint if the file exists.
func resume(path string, opt *optimizer.Optimizer, sig string) (bool, error) {
	if path == "" {
		return false, nil
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	f, err := checkpoint.Load(path)
	if err != nil {
		return false, err
	}
	if !f.Verified {
		return false, fmt.Errorf("checkpoint %s has no valid skyhive checksum; refusing to resume from it", path)
	}
	if m := f.Meta[metaModel]; m != sig {
		return false, fmt.Errorf("checkpoint %s holds model %q, not %q", path, m, sig)
	}
	v, ok := f.Tensors["state"]
	if !ok {
		return false, fmt.Errorf("checkpoint %s has no peer state (was it written by skyhive peer?)", path)
	}
	var s optimizer.State
	s.Vector = v.Data
	for key, dst := range map[string]*int{metaRound: &s.Round, metaStep: &s.OptStep, metaEpoch: &s.Epoch} {
		if *dst, err = strconv.Atoi(f.Meta[key]); err != nil || *dst < 0 {
			return false, fmt.Errorf("checkpoint %s: bad %s %q", path, key, f.Meta[key])
		}
	}
	if err := opt.LoadState(s); err != nil {
		return false, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return true, nil
}
