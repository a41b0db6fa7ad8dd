// Package experiment holds the long reproductions of the papers' results.
// Each experiment writes NAME.json and a NAME.png plot to an output
// directory and says where they are.
package experiment

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/skyhive/skyhive/chart"
	"github.com/skyhive/skyhive/checkpoint"
)

// Options are shared by all experiments.
type Options struct {
	// Out is the directory results are written to.
	Out string
	// Quick shrinks the experiment to a smoke run of a minute or two.
	Quick bool
	// Seed seeds everything random in the experiment.
	Seed uint64
	// Repeats, if more than 1, runs a repeatable experiment's runs this
	// many times, with seeds Seed, Seed+1, …, and evaluates its targets
	// over the repetitions (see Experiment.Repeatable).
	Repeats int
	// Only, if not empty, restricts an experiment made of several runs to
	// the runs with these names (each experiment documents its names).
	Only []string
	// DataDir overrides the Fashion-MNIST directory.
	DataDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Logf writes a progress line if o.Log is set.
func (o Options) Logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

// Experiment is a named reproduction.
type Experiment struct {
	Name  string
	Short string
	// Repeatable experiments take Options.Repeats above 1.
	Repeatable bool
	Run        func(ctx context.Context, o Options) error
}

// Launch checks that e supports o and runs it.
func (e Experiment) Launch(ctx context.Context, o Options) error {
	if o.Repeats < 0 {
		return fmt.Errorf("experiment %s: %d repeats; want 1 or more", e.Name, o.Repeats)
	}
	if o.Repeats > 1 && !e.Repeatable {
		var names []string
		for _, x := range All() {
			if x.Repeatable {
				names = append(names, x.Name)
			}
		}
		return fmt.Errorf("experiment %s runs once per seed: run it again with another seed instead of repeats (repeatable: %s)", e.Name, strings.Join(names, ", "))
	}
	return e.Run(ctx, o)
}

// All lists the experiments. Each lives in its own file in this package.
func All() []Experiment {
	return []Experiment{
		// Experiments register here, one line each.
		moeConvergence(),
		averagingConvergence(),
		skyComputing(),
		geoDataParallel(),
		geoDataParallelLM(),
	}
}

// Find returns the experiment with the given name.
func Find(name string) (Experiment, bool) {
	for _, e := range All() {
		if e.Name == name {
			return e, true
		}
	}
	return Experiment{}, false
}

// Lookup returns the experiment with the given name; an unknown name's
// error lists the experiments.
func Lookup(name string) (Experiment, error) {
	e, ok := Find(name)
	if !ok {
		return e, fmt.Errorf("unknown experiment %q; experiments:\n%s", name, List())
	}
	return e, nil
}

// List is the experiments, a line each: the name and what it reproduces.
func List() string {
	var b strings.Builder
	for _, e := range All() {
		fmt.Fprintf(&b, "  %-24s %s\n", e.Name, e.Short)
	}
	return b.String()
}

// Selected reports whether the run called name is to be run under o.Only.
func (o Options) Selected(name string) bool {
	return len(o.Only) == 0 || slices.Contains(o.Only, name)
}

// WriteResults writes v as indented JSON to Out/NAME.json and c as
// Out/NAME.png, both atomically, and returns the two paths.
func WriteResults(o Options, name string, v any, c chart.Chart) (jsonPath, pngPath string, err error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return "", "", fmt.Errorf("experiment: %w", err)
	}
	jsonPath = filepath.Join(o.Out, name+".json")
	pngPath = filepath.Join(o.Out, name+".png")
	err = checkpoint.WriteAtomic(jsonPath, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	})
	if err != nil {
		return "", "", fmt.Errorf("experiment: write %s: %w", jsonPath, err)
	}
	if err := chart.WritePNG(pngPath, c, 8, 5); err != nil {
		return "", "", err
	}
	return jsonPath, pngPath, nil
}
