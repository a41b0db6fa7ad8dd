package train

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/models"
)

// RunLocal refuses, before it reads anything, options that do not fit the
// model, naming them as FieldErrors.
func TestRunLocalRefusesOptions(t *testing.T) {
	given := func(names ...string) func(string) bool {
		return func(o string) bool { return slices.Contains(names, o) }
	}
	cases := []struct {
		c      Local
		fields []string
		text   string
	}{
		{Local{Config: Config{Model: "gpt-mni"}}, []string{"model"}, "unknown model (did you mean gpt-mini?)"},
		{Local{Config: Config{Model: "mlp"}, Data: "fashion-mnist", Given: given("vocab")}, []string{"vocab"}, "is for language models; mlp is an image classifier"},
		{Local{Config: Config{Model: "mlp"}, Data: "gcide", Given: given("data")}, []string{"model"}, "mlp is an image classifier and gcide is text"},
		{Local{Config: Config{Model: "gpt-mini"}, Data: "fashion-mnist", Given: given("data")}, []string{"data", "model"}, "gpt-mini is a language model"},
		{Local{Config: Config{Model: "gpt-mini"}, Given: given("epochs")}, []string{"epochs", "duration", "steps", "data"}, "is for image models"},
		{Local{Config: Config{Model: "bert-mlm-mini"}, Given: given("prompt")}, []string{"prompt"}, "is a masked language model"},
		{Local{Config: Config{Model: "gpt-mini"}, Data: "tokens:x.bin", LM: LMConfig{Vocab: 1024, Duration: 1}, Given: given("data")},
			[]string{"data", "vocab"}, "give the vocabulary of the token file"},
	}
	for _, tc := range cases {
		err := RunLocal(context.Background(), tc.c, io.Discard, io.Discard)
		var fe *launch.FieldError
		if !errors.As(err, &fe) || !slices.Equal(fe.Fields, tc.fields) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%+v: got %v, want fields %v and %q", tc.c, err, tc.fields, tc.text)
		}
	}
	if err := RunLocal(context.Background(), Local{Config: Config{Model: "mlp"}, Data: "cifar"}, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), `unknown data set "cifar"`) {
		t.Errorf("cifar: %v", err)
	}
}

// A language model takes its registry defaults for the optimizer options
// not given, and the run's length and context as the options given say.
func TestLocalLMConfig(t *testing.T) {
	c := Local{Config: Config{Model: "gpt-mini:64x2", BatchSize: 7, LR: 1, Warmup: 3, ClipNorm: 9}, LM: LMConfig{Seq: 32, Steps: 5, Duration: 10}}
	c.Given = func(o string) bool { return o == "batch" || o == "steps" }
	got, d := c.lmConfig(), models.DefaultsOf("gpt-mini")
	if got.BatchSize != 7 || got.LR != d.LR || got.Warmup != d.Warmup || got.ClipNorm != d.ClipNorm || got.Duration != 0 || got.Steps != 5 || got.Seq != 0 {
		t.Errorf("got %+v, defaults %+v", got, d)
	}
}
