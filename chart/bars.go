package chart

import (
	"errors"
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// BarSeries is one named series of a grouped bar chart: one value per
// group, and optionally one mark per group drawn as a black ring over the
// bar (e.g. a prediction next to the measured value). A zero value draws no
// bar, a zero mark no ring.
type BarSeries struct {
	Name   string
	Values []float64
	Marks  []float64
}

// Bars is a grouped bar chart: one group of bars per label in Groups, one
// bar per series in each group.
type Bars struct {
	Title, YLabel string
	Groups        []string
	Series        []BarSeries
	// YMax, when above the data, fixes the top of the y axis (e.g. the
	// same for several charts); 0 fits the data. The legend is drawn
	// below the plot.
	YMax float64
}

// WriteBarsPNG renders b as a PNG of the given size in inches at path,
// atomically as WritePNG does.
func WriteBarsPNG(path string, b Bars, width, height float64) error {
	p, legend, err := b.plot()
	if err != nil {
		return err
	}
	return renderPNG(path, width, height, func(dc draw.Canvas) { drawWithLegend(dc, p, legend, nil, true) })
}

// plot builds b's plot and legend (drawn below the plot: bars fill their
// groups from the bottom and leave no corner reliably free).
func (b Bars) plot() (*plot.Plot, []legendEntry, error) {
	if len(b.Series) == 0 || len(b.Groups) == 0 {
		return nil, nil, errors.New("chart: no bars to draw")
	}
	p := plot.New()
	p.Title.Text = b.Title
	p.Y.Label.Text = b.YLabel
	p.Add(plotter.NewGrid())
	p.Y.Tick.Marker = niceTicks{max: 8}
	var legend []legendEntry
	n := len(b.Series)
	w := vg.Points(min(16, 300/float64(n*len(b.Groups))))
	for i, s := range b.Series {
		if len(s.Values) != len(b.Groups) || (s.Marks != nil && len(s.Marks) != len(b.Groups)) {
			return nil, nil, fmt.Errorf("chart: series %q has %d values and %d marks for %d groups", s.Name, len(s.Values), len(s.Marks), len(b.Groups))
		}
		bars, err := plotter.NewBarChart(plotter.Values(s.Values), w)
		if err != nil {
			return nil, nil, fmt.Errorf("chart: series %q: %w", s.Name, err)
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(bars)
		legend = append(legend, legendEntry{name: s.Name, thumbs: []plot.Thumbnailer{bars}})
		if s.Marks == nil {
			continue
		}
		var pts plotter.XYs
		for g, m := range s.Marks {
			if m > 0 {
				pts = append(pts, plotter.XY{X: float64(g), Y: m})
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, nil, fmt.Errorf("chart: series %q marks: %w", s.Name, err)
		}
		// Bars are offset in canvas units: draw each ring over its bar.
		// Black rings show over any bar, including their own.
		sc.GlyphStyle.Shape = offsetGlyph{draw.RingGlyph{}, bars.Offset}
		sc.GlyphStyle.Radius = vg.Points(3)
		sc.GlyphStyle.Color = color.Black
		p.Add(sc)
	}
	p.NominalX(b.Groups...)
	p.X.Min, p.X.Max = -0.5, float64(len(b.Groups))-0.5
	p.Y.Min = 0
	p.Y.Max = max(p.Y.Max, b.YMax)
	return p, legend, nil
}

// offsetGlyph draws its glyph dx to the right of the point.
type offsetGlyph struct {
	draw.GlyphDrawer
	dx vg.Length
}

// DrawGlyph draws the glyph at pt moved by dx.
func (g offsetGlyph) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	pt.X += g.dx
	g.GlyphDrawer.DrawGlyph(c, sty, pt)
}
