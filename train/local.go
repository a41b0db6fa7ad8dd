package train

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/skyhive/skyhive/models"
)

// TextWriter is a result that prints itself as text (Result, LMResult,
// MLMResult).
type TextWriter interface {
	WriteText(w io.Writer)
}

// WriteText prints the test accuracy, epochs, time and parameters.
func (r Result) WriteText(w io.Writer) {
	fmt.Fprintf(w, "test accuracy %.2f%% after %d epochs in %.1fs (%d parameters)\n",
		100*r.TestAccuracy, len(r.Epochs), r.Seconds, r.Params)
}

// WriteText prints the validation perplexity next to the bigram's, the
// run's length and size, and the generated sample.
func (r LMResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "validation perplexity %.2f, bigram %.2f: ratio %.3f (target ≤ 0.6) after %d steps in %.1fs (%s, %d parameters)\n",
		r.ValPerplexity, r.BigramPerplexity, r.Ratio, r.Steps, r.Seconds, r.Model, r.Params)
	if r.Sample != "" {
		fmt.Fprintf(w, "sample: %s%s\n", r.Prompt, r.Sample)
	}
}

// WriteText prints the masked-token perplexity next to the unigram's,
// the accuracy, the run's length and size, and the fill-mask predictions.
func (r MLMResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "validation masked-token perplexity %.2f, unigram %.2f: ratio %.3f, accuracy %.1f%% after %d steps in %.1fs (%s, %d parameters)\n",
		r.ValPerplexity, r.UnigramPerplexity, r.Ratio, 100*r.ValAccuracy, r.Steps, r.Seconds, r.Model, r.Params)
	for _, m := range r.FillMask {
		fmt.Fprintf(w, "fill-mask: %s → %q (was %q)\n", m.Text, m.Prediction, m.Answer)
	}
}

// RunLanguageModel trains the language model cfg.Model on corpus: a
// masked one (BERT) with RunMLM, a GPT with RunLM.
func RunLanguageModel(ctx context.Context, cfg LMConfig, corpus Corpus, out io.Writer) (TextWriter, error) {
	if models.ObjectiveOf(cfg.Model) == models.MaskedLM {
		return RunMLM(ctx, cfg, corpus, out)
	}
	return RunLM(ctx, cfg, corpus, out)
}

// ClosestModel looks up the model name of spec (its part before ":") in
// the registry: known reports whether it is there; otherwise suggest is
// the closest name within two edits ("" if none), and names lists every
// name.
func ClosestModel(spec string) (known bool, suggest string, names []string) {
	name, _, _ := strings.Cut(spec, ":")
	dist := 3 // suggest only names within two edits
	for _, m := range models.List() {
		if m.Name == name {
			return true, "", nil
		}
		if slices.Contains(names, m.Name) {
			continue
		}
		names = append(names, m.Name)
		if d := editDistance(name, m.Name); d < dist {
			suggest, dist = m.Name, d
		}
	}
	return false, suggest, names
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
