// Package chart draws the line charts that experiments write next to their
// JSON results, e.g. test accuracy against wall-clock time per algorithm.
package chart

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one named line.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	// YMin and YMax fix the y range when YMax > YMin.
	YMin, YMax float64
}

// WritePNG renders c as a PNG of the given size in inches at path, writing a
// temporary file first and renaming it so a reader never sees half a file.
func WritePNG(path string, c Chart, width, height float64) error {
	p, err := c.plot()
	if err != nil {
		return err
	}
	return renderPNG(path, p, width, height)
}

// plot builds c's plot. A fixed y range is set after the lines are added
// (adding a line widens the axes to its data); lines outside it are
// clipped.
func (c Chart) plot() (*plot.Plot, error) {
	if len(c.Series) == 0 {
		return nil, errors.New("chart: no series to draw")
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Add(plotter.NewGrid())
	p.Legend.Top = false
	p.Legend.Left = false
	for i, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return nil, fmt.Errorf("chart: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		pts := make(plotter.XYs, len(s.X))
		for j := range s.X {
			pts[j].X, pts[j].Y = s.X[j], s.Y[j]
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("chart: series %q: %w", s.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / 7)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(s.Name, line)
	}
	if c.YMax > c.YMin {
		p.Y.Min, p.Y.Max = c.YMin, c.YMax
	}
	return p, nil
}

// renderPNG renders p as a width×height-inch PNG and replaces path with it
// atomically (a temporary file in the same directory, then a rename).
func renderPNG(path string, p *plot.Plot, width, height float64) error {
	w, err := p.WriterTo(vg.Length(width)*vg.Inch, vg.Length(height)*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("chart: render: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".chart-*.png")
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := w.WriteTo(tmp); err != nil {
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
