package chart

import (
	"fmt"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// rendered is a chart drawn in memory: its image, layout and a function
// from data coordinates to pixels.
type rendered struct {
	img    image.Image
	lay    layout
	pixel  func(x, y float64) image.Point
	toPix  func(vg.Point) image.Point
	height int
}

// render draws c at 8×5 inches, with or without its legend.
func render(t *testing.T, c Chart, withLegend bool) rendered {
	t.Helper()
	f, err := c.plot()
	if err != nil {
		t.Fatal(err)
	}
	var data draw.Canvas
	rd := renderWith(func(dc draw.Canvas) layout {
		lay := f.draw(dc, withLegend)
		data = draw.Canvas{Canvas: dc.Canvas, Rectangle: lay.data}
		return lay
	})
	tx, ty := f.p.Transforms(&data)
	rd.pixel = func(x, y float64) image.Point { return rd.toPix(vg.Point{X: tx(x), Y: ty(y)}) }
	return rd
}

// renderWith draws with drawFn at 8×5 inches.
func renderWith(drawFn func(draw.Canvas) layout) rendered {
	cv := vgimg.New(8*vg.Inch, 5*vg.Inch)
	lay := drawFn(draw.New(cv))
	img := cv.Image()
	h := img.Bounds().Dy()
	scale := cv.DPI() / 72
	toPix := func(p vg.Point) image.Point {
		return image.Pt(int(math.Round(float64(p.X)*scale)), h-int(math.Round(float64(p.Y)*scale)))
	}
	return rendered{img: img, lay: lay, height: h, toPix: toPix}
}

// coloured reports whether c is a colour rather than white, grey or
// black (the background, grid, axes and text).
func coloured(c color.Color) bool {
	r, g, b, _ := c.RGBA()
	hi, lo := max(r, g, b)>>8, min(r, g, b)>>8
	return hi-lo > 20
}

// near reports whether c is within tol (summed over r, g, b) of want.
func near(c, want color.Color, tol int) bool {
	r, g, b, _ := c.RGBA()
	wr, wg, wb, _ := want.RGBA()
	d := func(a, b uint32) int { return max(int(a>>8)-int(b>>8), int(b>>8)-int(a>>8)) }
	return d(r, wr)+d(g, wg)+d(b, wb) <= tol
}

// count counts the pixels within radius of p that ok accepts.
func count(img image.Image, p image.Point, radius int, ok func(color.Color) bool) int {
	n := 0
	for y := p.Y - radius; y <= p.Y+radius; y++ {
		for x := p.X - radius; x <= p.X+radius; x++ {
			if ok(img.At(x, y)) {
				n++
			}
		}
	}
	return n
}

// colouredIn counts the coloured pixels in the canvas rectangle r.
func colouredIn(rd rendered, r vg.Rectangle) int {
	a, b := rd.toPix(r.Min), rd.toPix(r.Max)
	n := 0
	for y := b.Y; y <= a.Y; y++ {
		for x := a.X; x <= b.X; x++ {
			if coloured(rd.img.At(x, y)) {
				n++
			}
		}
	}
	return n
}

// TestSinglePointShows: a series of one point (a one-point grid) leaves
// its colour at its location; a line through one point draws nothing.
func TestSinglePointShows(t *testing.T) {
	c := Chart{Title: "speed-up", XLabel: "workers", YLabel: "x", Series: []Series{
		{Name: "measured", X: []float64{4}, Y: []float64{1.3}},
		{Name: "predicted", X: []float64{4}, Y: []float64{1.6}},
	}}
	rd := render(t, c, false)
	for i, s := range c.Series {
		col := plotutil.Color(i)
		at := rd.pixel(s.X[0], s.Y[0])
		if n := count(rd.img, at, 3, func(c color.Color) bool { return near(c, col, 40) }); n < 5 {
			t.Errorf("series %q: %d pixels of its colour around %v", s.Name, n, at)
		}
	}
}

// crowded is nine waves that leave no corner free, with long names.
func crowded() Chart {
	c := Chart{Title: "waves", XLabel: "time (s)", YLabel: "value"}
	for k := range 9 {
		s := Series{Name: fmt.Sprintf("algorithm %d, seed %d (12.3k B/sample, 95%% busy)", k%3, k/3)}
		for i := 0; i <= 300; i++ {
			x := float64(i) * 0.6
			s.X = append(s.X, x)
			s.Y = append(s.Y, 50+40*math.Sin(x/(5+float64(k))+float64(k)))
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// falling is nine noisy falling curves, as repeated seeds of three
// algorithms draw them, with a fixed y range that cuts their start.
func falling() Chart {
	c := Chart{Title: "perplexity", XLabel: "time (s)", YLabel: "perplexity", YMin: 27, YMax: 70}
	for k := range 9 {
		s := Series{Name: fmt.Sprintf("algorithm %d, seed %d", k%3, k/3)}
		for i := 0; i <= 300; i++ {
			x := float64(i) * 0.6
			s.X = append(s.X, x)
			s.Y = append(s.Y, 28+200/(1+x/4)+float64(k)/3+2*math.Sin(float64(i*(k+1))))
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// rising is two rising curves that leave the top left corner free.
func rising() Chart {
	c := Chart{Title: "accuracy", XLabel: "time (s)", YLabel: "accuracy (%)"}
	for k := range 2 {
		s := Series{Name: fmt.Sprintf("algo %d", k)}
		for i := 0; i <= 50; i++ {
			s.X = append(s.X, float64(i))
			s.Y = append(s.Y, 60+30*(1-math.Exp(-float64(i)/(10+5*float64(k)))))
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// TestLegendCoversNoData: drawn without its legend, a chart has no
// coloured pixel where its legend goes; drawn with it, the legend's box
// has its thumbnails. The legend of a crowded chart goes below the plot,
// that of a chart with a free corner into that corner.
func TestLegendCoversNoData(t *testing.T) {
	for name, tc := range map[string]struct {
		c      Chart
		inside bool
	}{"crowded": {crowded(), false}, "rising": {rising(), true}, "falling": {falling(), true}} {
		rd := render(t, tc.c, false)
		box, data := rd.lay.legend, rd.lay.data
		if box.Size().X <= 0 || box.Size().Y <= 0 {
			t.Fatalf("%s: no legend box", name)
		}
		if n := colouredIn(rd, box); n > 0 {
			t.Errorf("%s: the legend box %v covers %d data pixels", name, box, n)
		}
		in := box.Min.X >= data.Min.X && box.Max.X <= data.Max.X && box.Min.Y >= data.Min.Y && box.Max.Y <= data.Max.Y
		if in != tc.inside {
			t.Errorf("%s: legend %v inside the data area %v: %v, want %v", name, box, data, in, tc.inside)
		}
		if !tc.inside && box.Max.Y >= data.Min.Y {
			t.Errorf("%s: legend %v not below the data area %v", name, box, data)
		}
		if n := colouredIn(render(t, tc.c, true), box); n < 10*len(tc.c.Series) {
			t.Errorf("%s: legend drawn with %d coloured pixels", name, n)
		}
	}
	// Bars: the legend goes below them.
	b := Bars{Title: "t", YLabel: "s", Groups: []string{"a", "b"}, Series: []BarSeries{
		{Name: "even", Values: []float64{2, 3}}, {Name: "skyhive", Values: []float64{3, 1}}}}
	p, legend, err := b.plot()
	if err != nil {
		t.Fatal(err)
	}
	rd := renderWith(func(dc draw.Canvas) layout { return drawWithLegend(dc, p, legend, nil, false) })
	if box := rd.lay.legend; box.Max.Y >= rd.lay.data.Min.Y || colouredIn(rd, box) > 0 {
		t.Errorf("bars: legend %v over the data area %v", box, rd.lay.data)
	}
}

// TestTickLabels: ticks are at round steps with no more decimals than
// the step needs.
func TestTickLabels(t *testing.T) {
	for _, tc := range []struct {
		lo, hi  float64
		max     int
		integer bool
		want    []string
	}{
		{0, 100, 8, false, []string{"0", "20", "40", "60", "80", "100"}},
		{12.3, 178, 10, false, []string{"20", "40", "60", "80", "100", "120", "140", "160"}},
		{29, 70, 8, false, []string{"30", "40", "50", "60", "70"}},
		{29, 70, 10, false, []string{"30", "35", "40", "45", "50", "55", "60", "65", "70"}},
		{0.5, 0.95, 8, false, []string{"0.5", "0.6", "0.7", "0.8", "0.9"}},
		{0.51, 0.58, 8, false, []string{"0.51", "0.52", "0.53", "0.54", "0.55", "0.56", "0.57", "0.58"}},
		{-1, 1, 8, false, []string{"-1.0", "-0.5", "0.0", "0.5", "1.0"}},
		{3, 5, 8, true, []string{"3", "4", "5"}},
		{0, 2e6, 8, false, []string{"0", "500000", "1000000", "1500000", "2000000"}},
		{1e20, 1e20, 8, false, []string{"100000000000000000000"}},
	} {
		var got []string
		for _, tk := range (niceTicks{max: tc.max, integer: tc.integer}).Ticks(tc.lo, tc.hi) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("[%v, %v]: labels %q, want %q", tc.lo, tc.hi, got, tc.want)
		}
	}
	// A chart's axes over 0-100 and 0-178 are labelled with integers.
	f, err := Chart{Series: []Series{{Name: "a", X: []float64{0, 88.5, 178}, Y: []float64{0, 51.5, 100}}}}.plot()
	if err != nil {
		t.Fatal(err)
	}
	for _, ax := range []struct {
		min, max float64
		ticks    []string
	}{{f.p.X.Min, f.p.X.Max, nil}, {f.p.Y.Min, f.p.Y.Max, nil}} {
		for _, tk := range f.p.X.Tick.Marker.Ticks(ax.min, ax.max) {
			if _, err := strconv.Atoi(tk.Label); tk.Label != "" && err != nil {
				t.Errorf("axis [%v, %v]: label %q is not an integer", ax.min, ax.max, tk.Label)
			}
		}
	}
}

// TestBandFills: a band series shades the area between its low and high
// values in its pale colour, draws its median line, and leaves the
// area outside the band white.
func TestBandFills(t *testing.T) {
	c := Chart{YMin: 0, YMax: 10, Series: []Series{{Name: "median, band min-max",
		X: []float64{0, 10}, Y: []float64{5, 5}, Lo: []float64{2, 2}, Hi: []float64{8, 8}}}}
	rd := render(t, c, false)
	col := plotutil.Color(0)
	r, g, b, _ := col.RGBA()
	pale := func(v uint32) uint8 { return uint8(255 - (255-float64(v>>8))*bandAlpha/255) }
	want := color.RGBA{R: pale(r), G: pale(g), B: pale(b), A: 255}
	for _, y := range []float64{2.7, 3.3, 6.7, 7.3} {
		if at := rd.pixel(5.3, y); !near(rd.img.At(at.X, at.Y), want, 24) {
			t.Errorf("y %v in the band: pixel %v, want about %v", y, rd.img.At(at.X, at.Y), want)
		}
	}
	for _, y := range []float64{1.3, 8.7} {
		if at := rd.pixel(5.3, y); coloured(rd.img.At(at.X, at.Y)) {
			t.Errorf("y %v outside the band: pixel %v", y, rd.img.At(at.X, at.Y))
		}
	}
	if at := rd.pixel(5.3, 5); !near(rd.img.At(at.X, at.Y), col, 40) {
		t.Errorf("median line: pixel %v, want about %v", rd.img.At(at.X, at.Y), col)
	}
	bad := c
	bad.Series = []Series{{Name: "b", X: []float64{0, 1}, Y: []float64{0, 1}, Lo: []float64{0}, Hi: []float64{1, 2}}}
	if _, err := bad.plot(); err == nil {
		t.Error("a band with too few low values was accepted")
	}
}

// TestMedianBand: repeated runs sampled at different times become their
// median with the minimum and maximum, over the range all runs cover.
func TestMedianBand(t *testing.T) {
	runs := []Series{
		{Name: "seed 1", X: []float64{0, 2, 4}, Y: []float64{10, 8, 6}},
		{Name: "seed 2", X: []float64{1, 3, 5}, Y: []float64{20, 10, 0}},
		{Name: "seed 3", X: []float64{1, 4}, Y: []float64{1, 4}},
	}
	s, err := MedianBand("algo", runs)
	if err != nil {
		t.Fatal(err)
	}
	want := Series{Name: "algo", X: []float64{1, 2, 3, 4},
		Y:  []float64{9, 8, 7, 5},
		Lo: []float64{1, 2, 3, 4},
		Hi: []float64{20, 15, 10, 6}}
	if fmt.Sprint(s) != fmt.Sprint(want) {
		t.Errorf("median band\n%v, want\n%v", s, want)
	}
	even, err := MedianBand("two", runs[:2])
	if err != nil || fmt.Sprint(even.X, even.Y) != "[1 2 3 4] [14.5 11.5 8.5 5.5]" {
		t.Errorf("median of two runs: %v %v, %v; want [14.5 11.5 8.5 5.5] at x 1-4", even.X, even.Y, err)
	}
	for name, bad := range map[string][]Series{
		"none":       nil,
		"empty run":  {{Name: "e"}},
		"decreasing": {{Name: "d", X: []float64{2, 1}, Y: []float64{0, 0}}},
		"disjoint":   {{Name: "a", X: []float64{0, 1}, Y: []float64{0, 0}}, {Name: "b", X: []float64{2, 3}, Y: []float64{0, 0}}},
	} {
		if _, err := MedianBand("x", bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestWriteSamples writes sample charts to $CHART_SAMPLES/chart-*.png for
// a person to look at; without it the test is skipped.
func TestWriteSamples(t *testing.T) {
	dir := os.Getenv("CHART_SAMPLES")
	if dir == "" {
		t.Skip("set CHART_SAMPLES to a directory to write sample charts")
	}
	bands := Chart{Title: "three algorithms, three seeds each", XLabel: "time (s)", YLabel: "perplexity", YMin: 26, YMax: 70}
	cr := falling()
	for a := range 3 {
		s, err := MedianBand(fmt.Sprintf("algorithm %d: median of 3 seeds, band min-max", a), []Series{cr.Series[a], cr.Series[a+3], cr.Series[a+6]})
		if err != nil {
			t.Fatal(err)
		}
		bands.Series = append(bands.Series, s)
	}
	single := Chart{Title: "one grid point", XLabel: "workers (8 encoder layers)", YLabel: "speed-up", Series: []Series{
		{Name: "measured", X: []float64{4}, Y: []float64{1.31}, Lo: []float64{1.2}, Hi: []float64{1.4}},
		{Name: "predicted", X: []float64{4}, Y: []float64{1.52}},
	}}
	for name, c := range map[string]Chart{"crowded": crowded(), "rising": rising(), "falling": falling(), "bands": bands, "single": single} {
		if err := WritePNG(filepath.Join(dir, "chart-"+name+".png"), c, 8, 5); err != nil {
			t.Fatal(err)
		}
	}
	b := Bars{Title: "iteration time", YLabel: "s", Groups: []string{"4x8", "8x8", "16x48"}, Series: []BarSeries{
		{Name: "even", Values: []float64{2, 1, 3}, Marks: []float64{1.8, 0.9, 2.5}},
		{Name: "skyhive", Values: []float64{1, 0.5, 1.5}, Marks: []float64{1.1, 0.4, 0}},
	}}
	if err := WriteBarsPNG(filepath.Join(dir, "chart-bars.png"), b, 8, 5); err != nil {
		t.Fatal(err)
	}
}
