package chart

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteBarsPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bars.png")
	if out := os.Getenv("CHART_BARS_OUT"); out != "" {
		path = out
	}
	b := Bars{Title: "t", YLabel: "s", Groups: []string{"4x8", "8x8", "16x48"}, Series: []BarSeries{
		{Name: "even", Values: []float64{2, 1, 3}, Marks: []float64{1.8, 0.9, 2.5}},
		{Name: "skyhive", Values: []float64{1, 0.5, 1.5}, Marks: []float64{1.1, 0.4, 0}},
	}}
	if err := WriteBarsPNG(path, b, 6, 4); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() == 0 {
		t.Fatalf("%v", err)
	}
	b.Series[0].Values = b.Series[0].Values[:2]
	if err := WriteBarsPNG(path, b, 6, 4); err == nil {
		t.Error("accepted a series with too few values")
	}
	if err := WriteBarsPNG(path, Bars{}, 6, 4); err == nil {
		t.Error("accepted an empty chart")
	}
}
