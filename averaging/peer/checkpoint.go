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
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/tensor"
)

// Checkpoint metadata keys. A language model's checkpoint also names its
// task and holds its tokenizer (as `skyhive train` writes them), so that
// the file says how to read its token ids.
const (
	metaModel     = "skyhive.model"
	metaRound     = "skyhive.round"
	metaStep      = "skyhive.optim_step"
	metaEpoch     = "skyhive.epoch"
	metaTask      = "skyhive.task"
	metaTokenizer = "skyhive.tokenizer"
	metaData      = "skyhive.data"
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
	if lt, ok := t.task.(*lmTask); ok {
		meta[metaTask] = models.LanguageModeling.String()
		meta[metaData] = t.cfg.Data
		if tok := lt.data.Tokenizer; tok != nil {
			b, err := tok.MarshalJSON()
			if err != nil {
				return fmt.Errorf("save checkpoint: %w", err)
			}
			meta[metaTokenizer] = string(b)
		}
	}
	if err := checkpoint.Save(t.cfg.Checkpoint, tensors, meta); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// loadCheckpoint reads the checkpoint at path if the file exists (nil if
// not, or without a path) and checks that it holds the state of the model
// whose signature is sig: a peer cannot resume into another model, nor a
// language model on another tokenizer.
func loadCheckpoint(path, sig string) (*checkpoint.File, error) {
	if path == "" {
		return nil, nil
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	f, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	if !f.Verified {
		return nil, fmt.Errorf("checkpoint %s has no valid skyhive checksum; refusing to resume from it", path)
	}
	if m := f.Meta[metaModel]; m != sig {
		return nil, fmt.Errorf("%w: checkpoint %s holds model %q, not %q: a peer resumes only the model it saved (with a language model, also its data, --vocab and --seq); give the model it was saved with, or another --checkpoint file",
			ErrConfig, path, m, sig)
	}
	if _, ok := f.Tensors["state"]; !ok {
		return nil, fmt.Errorf("checkpoint %s has no peer state (was it written by skyhive peer?)", path)
	}
	return f, nil
}

// resume loads the checkpoint f read from path into opt (false if f is
// nil).
func resume(path string, f *checkpoint.File, opt *optimizer.Optimizer) (bool, error) {
	if f == nil {
		return false, nil
	}
	var s optimizer.State
	s.Vector = f.Tensors["state"].Data
	var err error
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
