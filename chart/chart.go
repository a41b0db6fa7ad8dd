// Package chart draws the line charts that experiments write next to their
// JSON results, e.g. test accuracy against wall-clock time per algorithm.
//
// Charts are drawn to be read: a series of few points is drawn with a
// mark at each point (so a single point shows), the legend sits where it
// covers no data (a free corner of the plot, or below it), the axes are
// marked at round steps, and repeated runs of one thing (seeds) can be
// drawn as one median line with a shaded band (MedianBand).
package chart

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one named line. With Lo and Hi (as many values as X) it is
// also a band: the area between Lo and Hi is shaded in the line's colour,
// e.g. the minimum and maximum over repeated runs around their median Y
// (see MedianBand; say in Name what the band is).
type Series struct {
	Name   string
	X, Y   []float64
	Lo, Hi []float64
}

// Chart is a line chart.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	// YMin and YMax fix the y range when YMax > YMin.
	YMin, YMax float64
}

// Drawing constants: a series of at most markMax points gets a mark at
// each point; lines are lineWidth wide; bands are shaded with bandAlpha.
const (
	markMax   = 20
	lineWidth = 1.5
	bandAlpha = 70
	// axisMargin is the margin around the data, as a fraction of its
	// range: on the y axis, and on the x axis when a series has marks.
	axisMargin = 0.04
)

// markShapes are the filled marks of the series, in turn.
var markShapes = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}}

// WritePNG renders c as a PNG of the given size in inches at path, writing a
// temporary file first and renaming it so a reader never sees half a file.
func WritePNG(path string, c Chart, width, height float64) error {
	f, err := c.plot()
	if err != nil {
		return err
	}
	return renderPNG(path, width, height, func(dc draw.Canvas) { f.draw(dc, true) })
}

// figure is a chart's plot with its legend and, for placing the legend,
// the data it draws: polylines (a single point is a mark) and bands.
type figure struct {
	p       *plot.Plot
	legend  []legendEntry
	lines   []plotter.XYs
	bands   []Series
	markRad vg.Length
}

// plot builds c's plot. A fixed y range is set after the lines are added
// (adding a line widens the axes to its data); lines outside it are
// clipped.
func (c Chart) plot() (*figure, error) {
	if len(c.Series) == 0 {
		return nil, errors.New("chart: no series to draw")
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Add(plotter.NewGrid())
	f := &figure{p: p, markRad: vg.Points(3.5)}
	xInt, yInt := true, true
	for i, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return nil, fmt.Errorf("chart: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		if (s.Lo != nil || s.Hi != nil) && (len(s.Lo) != len(s.X) || len(s.Hi) != len(s.X)) {
			return nil, fmt.Errorf("chart: series %q has %d x values and a band of %d low and %d high", s.Name, len(s.X), len(s.Lo), len(s.Hi))
		}
		xInt = xInt && integers(s.X)
		yInt = yInt && integers(s.Y, s.Lo, s.Hi)
		e, err := f.add(i, s)
		if err != nil {
			return nil, fmt.Errorf("chart: series %q: %w", s.Name, err)
		}
		f.legend = append(f.legend, e)
	}
	p.X.Tick.Marker = niceTicks{max: 10, integer: xInt}
	p.Y.Tick.Marker = niceTicks{max: 8, integer: yInt}
	// A margin around the data keeps the first and last points off the
	// axes and marks whole.
	pad := func(a *plot.Axis) {
		d := max(a.Max-a.Min, 1e-9*max(math.Abs(a.Min), math.Abs(a.Max)))
		a.Min, a.Max = a.Min-axisMargin*d, a.Max+axisMargin*d
	}
	pad(&p.Y)
	if c.YMax > c.YMin {
		p.Y.Min, p.Y.Max = c.YMin, c.YMax
	}
	for _, s := range c.Series {
		if len(s.X) <= markMax && p.X.Max > p.X.Min {
			pad(&p.X)
			break
		}
	}
	return f, nil
}

// add draws series s as the i-th: its band, its line (two points or
// more) and, with few points, a mark at each; it returns its legend entry.
func (f *figure) add(i int, s Series) (legendEntry, error) {
	e := legendEntry{name: s.Name}
	col := plotutil.Color(i)
	pts := make(plotter.XYs, len(s.X))
	for j := range s.X {
		pts[j].X, pts[j].Y = s.X[j], s.Y[j]
	}
	if s.Lo != nil && len(s.X) > 0 {
		band, err := bandPlotter(s, col)
		if err != nil {
			return e, err
		}
		f.p.Add(band)
		e.thumbs = append(e.thumbs, band)
		f.bands = append(f.bands, s)
	}
	if len(pts) > 1 {
		line, err := plotter.NewLine(pts)
		if err != nil {
			return e, err
		}
		line.Color = col
		line.Dashes = plotutil.Dashes(i / 7)
		line.Width = vg.Points(lineWidth)
		f.p.Add(line)
		e.thumbs = append(e.thumbs, line)
	}
	if len(pts) <= markMax {
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return e, err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: f.markRad, Shape: markShapes[i%len(markShapes)]}
		f.p.Add(sc)
		e.thumbs = append(e.thumbs, sc)
	}
	f.lines = append(f.lines, pts)
	return e, nil
}

// thumbPlotter is a plotter with a legend thumbnail.
type thumbPlotter interface {
	plot.Plotter
	plot.Thumbnailer
}

// bandPlotter shades s's band in a pale col: the area between Lo and Hi,
// or for a single point a bar from Lo to Hi.
func bandPlotter(s Series, col color.Color) (thumbPlotter, error) {
	r, g, b, _ := col.RGBA()
	pale := color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: bandAlpha}
	if len(s.X) == 1 {
		bar, err := plotter.NewLine(plotter.XYs{{X: s.X[0], Y: s.Lo[0]}, {X: s.X[0], Y: s.Hi[0]}})
		if err != nil {
			return nil, err
		}
		bar.Color, bar.Width = pale, vg.Points(8)
		return bar, nil
	}
	ring := make(plotter.XYs, 0, 2*len(s.X))
	for j := range s.X {
		ring = append(ring, plotter.XY{X: s.X[j], Y: s.Hi[j]})
	}
	for j := len(s.X) - 1; j >= 0; j-- {
		ring = append(ring, plotter.XY{X: s.X[j], Y: s.Lo[j]})
	}
	poly, err := plotter.NewPolygon(ring)
	if err != nil {
		return nil, err
	}
	poly.Color = pale
	poly.LineStyle.Width = 0
	return poly, nil
}

// draw draws the figure on dc with its legend where it covers no data;
// drawLegend false leaves the legend's box empty (for tests).
func (f *figure) draw(dc draw.Canvas, drawLegend bool) layout {
	return drawWithLegend(dc, f.p, f.legend, f.free, drawLegend)
}

// free reports whether r, on the data canvas data, is clear of every
// line, mark and band.
func (f *figure) free(data draw.Canvas, r vg.Rectangle) bool {
	tx, ty := f.p.Transforms(&data)
	at := func(x, y float64) vg.Point { return vg.Point{X: tx(x), Y: ty(y)} }
	grown := vg.Rectangle{Min: vg.Point{X: r.Min.X - f.markRad, Y: r.Min.Y - f.markRad},
		Max: vg.Point{X: r.Max.X + f.markRad, Y: r.Max.Y + f.markRad}}
	for _, l := range f.lines {
		for j := range l {
			a := at(l[j].X, l[j].Y)
			if len(l) <= markMax && a.X >= grown.Min.X && a.X <= grown.Max.X && a.Y >= grown.Min.Y && a.Y <= grown.Max.Y {
				return false
			}
			if j > 0 && segmentHits(at(l[j-1].X, l[j-1].Y), a, r) {
				return false
			}
		}
	}
	for _, s := range f.bands {
		for j := range s.X {
			lo, hi := at(s.X[j], s.Lo[j]), at(s.X[j], s.Hi[j])
			if segmentHits(lo, hi, r) {
				return false
			}
			if j > 0 && trapezoidHits(at(s.X[j-1], s.Lo[j-1]), at(s.X[j-1], s.Hi[j-1]), lo, hi, r) {
				return false
			}
		}
	}
	return true
}

// segmentHits reports whether the segment from a to b crosses r
// (Liang-Barsky clipping).
func segmentHits(a, b vg.Point, r vg.Rectangle) bool {
	t0, t1 := 0.0, 1.0
	dx, dy := float64(b.X-a.X), float64(b.Y-a.Y)
	for _, c := range [4][2]float64{
		{-dx, float64(a.X - r.Min.X)}, {dx, float64(r.Max.X - a.X)},
		{-dy, float64(a.Y - r.Min.Y)}, {dy, float64(r.Max.Y - a.Y)},
	} {
		p, q := c[0], c[1]
		if p == 0 {
			if q < 0 {
				return false
			}
			continue
		}
		if t := q / p; p < 0 {
			t0 = max(t0, t)
		} else {
			t1 = min(t1, t)
		}
		if t0 > t1 {
			return false
		}
	}
	return true
}

// trapezoidHits reports whether the band between two vertical edges
// (lo0-hi0 and lo1-hi1) may cross r: whether r meets the bounding box of
// the band's part above r's x range, which errs towards a hit.
func trapezoidHits(lo0, hi0, lo1, hi1 vg.Point, r vg.Rectangle) bool {
	x0, x1 := max(lo0.X, r.Min.X), min(lo1.X, r.Max.X)
	if x0 > x1 {
		return false
	}
	y := func(a, b vg.Point, x vg.Length) vg.Length {
		if b.X == a.X {
			return a.Y
		}
		return a.Y + (b.Y-a.Y)*(x-a.X)/(b.X-a.X)
	}
	ys := []vg.Length{y(lo0, lo1, x0), y(lo0, lo1, x1), y(hi0, hi1, x0), y(hi0, hi1, x1)}
	return min(ys[0], ys[1], ys[2], ys[3]) <= r.Max.Y && max(ys[0], ys[1], ys[2], ys[3]) >= r.Min.Y
}

// renderPNG draws a width×height-inch PNG with drawFn and replaces path
// with it atomically (a temporary file in the same directory, then a
// rename).
func renderPNG(path string, width, height float64, drawFn func(draw.Canvas)) error {
	cv := vgimg.New(vg.Length(width)*vg.Inch, vg.Length(height)*vg.Inch)
	drawFn(draw.New(cv))
	tmp, err := os.CreateTemp(filepath.Dir(path), ".chart-*.png")
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := (vgimg.PngCanvas{Canvas: cv}).WriteTo(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("chart: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("chart: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}
