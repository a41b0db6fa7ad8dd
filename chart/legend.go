package chart

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// legendEntry is one line of a legend: a name and the thumbnails of what
// it names.
type legendEntry struct {
	name   string
	thumbs []plot.Thumbnailer
}

// layout is where a chart was drawn, in canvas units: the data area and
// the legend's box (empty without a legend).
type layout struct {
	data, legend vg.Rectangle
}

// Legend spacing: the margin between the legend box and the data or the
// plot's edge, the padding inside an inner legend's box, and the gap
// between the columns of a legend below the plot.
const (
	legendMargin = vg.Length(4)
	legendPad    = vg.Length(3)
	legendGap    = vg.Length(14)
)

// newLegend returns a legend of entries with its icons on the left, drawn
// from the top of the canvas it is given.
func newLegend(entries []legendEntry) plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = vg.Points(10)
	for _, e := range entries {
		l.Add(e.name, e.thumbs...)
	}
	return l
}

// drawWithLegend draws p and a legend of entries on dc so that the legend
// covers no data: in a corner of the data area where free reports no
// data under it (free may be nil: never), otherwise below the plot in as
// many columns as fit its width. With drawLegend false it makes the same
// layout and leaves the legend's box empty, which lets a test look at the
// pixels under it.
func drawWithLegend(dc draw.Canvas, p *plot.Plot, entries []legendEntry, free func(data draw.Canvas, r vg.Rectangle) bool, drawLegend bool) layout {
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	if len(entries) == 0 {
		p.Draw(dc)
		return layout{data: p.DataCanvas(dc).Rectangle}
	}
	l := newLegend(entries)
	size := l.Rectangle(dc).Size()
	data := p.DataCanvas(dc)
	box := vg.Point{X: size.X + 2*legendPad, Y: size.Y + 2*legendPad}
	if free != nil {
		for _, r := range corners(data.Rectangle, box) {
			grown := vg.Rectangle{Min: vg.Point{X: r.Min.X - legendMargin, Y: r.Min.Y - legendMargin},
				Max: vg.Point{X: r.Max.X + legendMargin, Y: r.Max.Y + legendMargin}}
			if !free(data, grown) {
				continue
			}
			p.Draw(dc)
			if drawLegend {
				dc.SetColor(color.White)
				dc.Fill(r.Path())
				dc.SetLineStyle(draw.LineStyle{Color: color.Gray{Y: 180}, Width: vg.Points(0.5)})
				dc.Stroke(r.Path())
				inner := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
					Min: vg.Point{X: r.Min.X + legendPad, Y: r.Min.Y + legendPad},
					Max: vg.Point{X: r.Max.X - legendPad, Y: r.Max.Y - legendPad}}}
				l.Draw(inner)
			}
			return layout{data: data.Rectangle, legend: r}
		}
	}
	return drawBelow(dc, p, entries, data.Min.X, drawLegend)
}

// corners returns the boxes of the given size in the four corners of
// data, inset by the legend margin: top right, top left, bottom right,
// bottom left; none where the box does not fit.
func corners(data vg.Rectangle, box vg.Point) []vg.Rectangle {
	in := vg.Rectangle{Min: vg.Point{X: data.Min.X + legendMargin, Y: data.Min.Y + legendMargin},
		Max: vg.Point{X: data.Max.X - legendMargin, Y: data.Max.Y - legendMargin}}
	if box.X > in.Size().X || box.Y > in.Size().Y {
		return nil
	}
	at := func(x, y vg.Length) vg.Rectangle {
		return vg.Rectangle{Min: vg.Point{X: x, Y: y}, Max: vg.Point{X: x + box.X, Y: y + box.Y}}
	}
	left, right := in.Min.X, in.Max.X-box.X
	bottom, top := in.Min.Y, in.Max.Y-box.Y
	return []vg.Rectangle{at(right, top), at(left, top), at(right, bottom), at(left, bottom)}
}

// drawBelow draws p above a legend of entries laid out in rows, as many
// entries a row as fit between x0 and the right edge of dc.
func drawBelow(dc draw.Canvas, p *plot.Plot, entries []legendEntry, x0 vg.Length, drawLegend bool) layout {
	var colW vg.Length
	for _, e := range entries {
		one := newLegend([]legendEntry{e})
		colW = max(colW, one.Rectangle(dc).Size().X)
	}
	avail := dc.Max.X - legendMargin - x0
	cols := max(1, min(len(entries), int(math.Floor(float64((avail+legendGap)/(colW+legendGap))))))
	columns := make([][]legendEntry, cols)
	for i, e := range entries {
		columns[i%cols] = append(columns[i%cols], e)
	}
	var h vg.Length
	for _, col := range columns {
		l := newLegend(col)
		h = max(h, l.Rectangle(dc).Size().Y)
	}
	strip := h + 2*legendMargin
	p.Draw(draw.Crop(dc, 0, 0, strip, 0))
	data := p.DataCanvas(draw.Crop(dc, 0, 0, strip, 0))
	box := vg.Rectangle{Min: vg.Point{X: x0, Y: dc.Min.Y + legendMargin},
		Max: vg.Point{X: x0 + vg.Length(cols)*colW + vg.Length(cols-1)*legendGap, Y: dc.Min.Y + legendMargin + h}}
	if drawLegend {
		for k, col := range columns {
			l := newLegend(col)
			x := x0 + vg.Length(k)*(colW+legendGap)
			l.Draw(draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
				Min: vg.Point{X: x, Y: box.Min.Y}, Max: vg.Point{X: x + colW, Y: box.Max.Y}}})
		}
	}
	return layout{data: data.Rectangle, legend: box}
}
