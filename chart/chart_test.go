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
