package peer

import (
	"fmt"
	"strings"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/train"
)

// lmOnly and imageOnly name the options (a launch.Peer's JSON fields) that
// only language models, and only image models, take.
var (
	lmOnly    = []string{"corpus_bytes", "vocab", "seq", "token_width", "eval_tokens", "warmup", "clip", "weight_decay"}
	imageOnly = []string{"data_dir", "limit", "momentum", "shard", "eval_examples"}
)

// Resolve checks the options of c that were given (given, called with a
// launch.Peer field's JSON name, says which) against its model, as a
// command's flags give them: c's language-model options hold the values
// of the flags, where 0 means none (no bound, no warm-up, no clipping, no
// decay) and Data is "fashion-mnist" unless given. It then settles them as
// a launch.Peer holds them: an image classifier keeps none of them; a
// language model trains on gcide unless Data is given, on the context of
// its spec (Seq 0) where the spec has one and Seq is not given, and has
// its 0s as ToField makes them. The errors are *launch.FieldError where
// they concern options.
func Resolve(c *launch.Peer, given func(field string) bool) error {
	if !train.IsLanguageModel(c.Model) {
		if err := checkImageData(c, given); err != nil {
			return err
		}
		c.Data, c.Seq, c.Vocab, c.TokenWidth, c.EvalTokens, c.CorpusBytes = "", 0, 0, 0, 0, 0
		c.Warmup, c.Clip, c.WeightDecay = 0, 0, 0
		return nil
	}
	if !given("data") {
		c.Data = "gcide"
	}
	if err := checkTextData(c, given); err != nil {
		return err
	}
	if !given("seq") && strings.Contains(c.Model, ":") {
		c.Seq = 0 // the spec's
	}
	c.CorpusBytes = int64(ToField(float64(c.CorpusBytes)))
	c.Warmup = int(ToField(float64(c.Warmup)))
	c.Clip, c.WeightDecay = ToField(c.Clip), ToField(c.WeightDecay)
	return nil
}

// checkImageData refuses the language-model options given to an image
// classifier, and data other than Fashion-MNIST.
func checkImageData(c *launch.Peer, given func(string) bool) error {
	for _, f := range lmOnly {
		if given(f) {
			return &launch.FieldError{Fields: []string{f}, Text: fmt.Sprintf("%%s is for language models; %s is an image classifier (language models: gpt-mini, gpt-small, gpt-medium or gpt:LAYERSxHIDDEN:VOCAB)", c.Model)}
		}
	}
	switch {
	case c.Data == "fashion-mnist":
	case train.IsTextData(c.Data):
		return &launch.FieldError{Fields: []string{"model"}, Text: fmt.Sprintf("%s is an image classifier and %s is text: train a language model on it (%%s gpt-mini), or train %s on fashion-mnist", c.Model, c.Data, c.Model)}
	default:
		return fmt.Errorf("unknown data set %q (supported: fashion-mnist for image models; %s for language models)", c.Data, train.TextDataUsage)
	}
	return nil
}

// checkTextData refuses the image options given to a language model, data
// that is not text, a token file without its vocabulary and language-model
// options out of range.
func checkTextData(c *launch.Peer, given func(string) bool) error {
	for _, f := range imageOnly {
		if given(f) {
			return &launch.FieldError{Fields: []string{f, "data"}, Text: fmt.Sprintf("%%s is for image models; language model %s trains with AdamW on %%s %s", c.Model, c.Data)}
		}
	}
	switch {
	case c.Data == "fashion-mnist":
		return &launch.FieldError{Fields: []string{"data", "model"}, Text: fmt.Sprintf("%s is a language model and fashion-mnist is images: train it on text (%%s %s), or train an image model (%%s %s)", c.Model, train.TextDataUsage, models.Usage())}
	case !train.IsTextData(c.Data):
		return fmt.Errorf("unknown data %q for language model %s (want %s)", c.Data, c.Model, train.TextDataUsage)
	case strings.HasPrefix(c.Data, "tokens:") && !given("vocab"):
		return &launch.FieldError{Fields: []string{"data", "vocab"}, Text: "%s " + c.Data + ": give the vocabulary of the token file with %s (50257 for GPT-2's tokenizer)"}
	case c.Seq < 1 || c.Vocab < 1 || c.CorpusBytes < 0 || c.EvalTokens < 0 || c.Warmup < 0 || c.Clip < 0 || c.WeightDecay < 0:
		return &launch.FieldError{Fields: []string{"seq", "vocab", "corpus_bytes", "eval_tokens", "warmup", "clip", "weight_decay"},
			Text: "%s and %s must be positive, and %s, %s, %s, %s and %s not negative"}
	}
	return nil
}
