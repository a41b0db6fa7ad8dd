package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestWritePNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acc.png")
	c := Chart{Title: "accuracy", XLabel: "seconds", YLabel: "test accuracy", Series: []Series{
		{Name: "a", X: []float64{0, 1, 2}, Y: []float64{0.1, 0.5, 0.8}},
		{Name: "b", X: []float64{0, 2}, Y: []float64{0.1, 0.9}},
	}}
	if err := WritePNG(path, c, 6, 4); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 1000 {
		t.Fatalf("not a PNG (%d bytes)", len(b))
	}
	if err := WritePNG(path, Chart{Series: []Series{{Name: "bad", X: []float64{1}}}}, 6, 4); err == nil {
		t.Fatal("mismatched series accepted")
	}
	if err := WritePNG(path, Chart{}, 6, 4); err == nil {
		t.Fatal("empty chart accepted")
	}
}

// TestChartFixedRange: YMin and YMax fix the y axis even where the data
// go beyond it (adding a line used to widen the axis again); without them
// the axis covers the data.
func TestChartFixedRange(t *testing.T) {
	series := []Series{{Name: "ppl", X: []float64{0, 1, 2}, Y: []float64{250, 60, 31}}}
	f, err := Chart{Series: series, YMin: 29, YMax: 70}.plot()
	if err != nil {
		t.Fatal(err)
	}
	if p := f.p; p.Y.Min != 29 || p.Y.Max != 70 {
		t.Errorf("fixed range: y axis [%v, %v], want [29, 70]", p.Y.Min, p.Y.Max)
	}
	f, err = Chart{Series: series}.plot()
	if err != nil {
		t.Fatal(err)
	}
	if p := f.p; p.Y.Min > 31 || p.Y.Max < 250 {
		t.Errorf("free range: y axis [%v, %v] does not cover the data", p.Y.Min, p.Y.Max)
	}
	if err := WritePNG(filepath.Join(t.TempDir(), "ppl.png"), Chart{Series: series, YMin: 29, YMax: 70}, 6, 4); err != nil {
		t.Fatal(err)
	}
}
