package experiment

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/chart"
)

// TestSkySpeedupChartSinglePoint: a grid of one point gives a measured
// and a predicted series of one point each, drawn as a valid PNG; with
// repetitions each has the band of the repetitions' values.
func TestSkySpeedupChartSinglePoint(t *testing.T) {
	pt := func(meas, pred float64) skyPoint {
		return skyPoint{Name: "4x8", Workers: 4, Layers: 8, Results: []skyStrategyResult{
			{Strategy: "even"}, {Strategy: "skyhive", SpeedupOnEven: meas, PredictedSpeedup: pred}}}
	}
	res := &skyResults{Points: []skyPoint{pt(1.3, 1.5)}}
	c := skySpeedupChart(res)
	if len(c.Series) != 2 || len(c.Series[0].X) != 1 || c.Series[0].Y[0] != 1.3 || c.Series[1].Y[0] != 1.5 || c.Series[0].Lo != nil {
		t.Fatalf("one point: series %+v", c.Series)
	}
	if !strings.Contains(c.XLabel, "workers") {
		t.Errorf("x label %q", c.XLabel)
	}
	path := filepath.Join(sampleDir(t), "chart-sky-one-point.png")
	if err := chart.WritePNG(path, c, 8, 5); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatal(err)
	}
	res.Repeats = []skyRepeat{
		{Seed: 1, Points: []skyPoint{pt(1.1, 1.4)}},
		{Seed: 2, Points: []skyPoint{pt(1.3, 1.5)}},
		{Seed: 3, Points: []skyPoint{pt(1.6, 1.7)}},
	}
	c = skySpeedupChart(res)
	m, p := c.Series[0], c.Series[1]
	if m.Lo[0] != 1.1 || m.Hi[0] != 1.6 || p.Lo[0] != 1.4 || p.Hi[0] != 1.7 || !strings.Contains(m.Name, "min-max of 3 repetitions") {
		t.Errorf("repeated: measured %+v, predicted %+v", m, p)
	}
	if err := chart.WritePNG(filepath.Join(filepath.Dir(path), "chart-sky-repeats.png"), c, 8, 5); err != nil {
		t.Fatal(err)
	}
}

// sampleDir is $CHART_SAMPLES, where a person can look at the charts
// the tests draw, or else a temporary directory.
func sampleDir(t *testing.T) string {
	if d := os.Getenv("CHART_SAMPLES"); d != "" {
		return d
	}
	return t.TempDir()
}

// TestGeoChartSeeds: one repetition draws a line per algorithm; several
// draw each algorithm's seeds as its median in a min-max band, and the
// language model's y range keeps the band's bottom.
func TestGeoChartSeeds(t *testing.T) {
	run := func(algo string, scale float64) geoRun {
		r := geoRun{Algo: algo}
		for i, ppl := range []float64{300, 90, 60, 45, 40} {
			r.Curve = append(r.Curve, geoEval{Seconds: float64(10 * i), Perplexity: scale * ppl})
		}
		return r
	}
	c := geoConfig{Name: geoLMName, Text: true, Model: "gpt", Data: "gcide", Regions: []string{"a", "b", "c"}, PerRegion: 2, Target: 35}
	one := []geoRepeat{{Seed: 1, Runs: []geoRun{run("diloco", 1), run("wagma", 1.1)}}}
	ch, err := geoChart(Options{}, c, one)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Series) != 2 || ch.Series[0].Lo != nil || !strings.HasPrefix(ch.Series[0].Name, "diloco (") {
		t.Errorf("one repetition: %+v", ch.Series)
	}
	reps := []geoRepeat{
		{Seed: 1, Runs: []geoRun{run("diloco", 1), run("wagma", 1.1)}},
		{Seed: 2, Runs: []geoRun{run("diloco", 0.9), run("wagma", 1.2)}},
		{Seed: 3, Runs: []geoRun{run("diloco", 1.05), run("wagma", 1.0)}},
	}
	ch, err = geoChart(Options{}, c, reps)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Series) != 2 {
		t.Fatalf("three repetitions: %d series, want one per algorithm", len(ch.Series))
	}
	d := ch.Series[0]
	if d.Name != "diloco: median of 3 seeds, band min-max" || len(d.Lo) != 5 || d.Lo[4] != 36 || d.Y[4] != 40 || d.Hi[4] != 42 {
		t.Errorf("diloco band %+v", d)
	}
	if ch.YMin > 36*0.95 || ch.YMax != 70 {
		t.Errorf("y range [%v, %v] does not hold the band's bottom 36 and twice the target", ch.YMin, ch.YMax)
	}
	if err := chart.WritePNG(filepath.Join(sampleDir(t), "chart-geo-seeds.png"), ch, 8, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := geoChart(Options{}, c, []geoRepeat{{Seed: 1, Runs: []geoRun{{Algo: "diloco"}}}}); err == nil {
		t.Error("a chart without curves was accepted")
	}
}
