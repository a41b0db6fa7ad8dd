package profile

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// Output saves a profile to Out and says so, and prints it as a table or
// JSON; a device's JSON carries its format tag.
func TestOutput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev.json")
	d := Device{Name: "d0", Speed: 1e9, Slowdown: 1, MemBytes: 1 << 30}
	var w, log bytes.Buffer
	if err := (Output{W: &w, Log: &log, Out: path, JSON: true}).Device(d); err != nil {
		t.Fatal(err)
	}
	if log.String() != "wrote "+path+"\n" {
		t.Errorf("log %q", log.String())
	}
	var got struct {
		Format string `json:"format"`
		Name   string `json:"name"`
	}
	if err := json.Unmarshal(w.Bytes(), &got); err != nil || got.Format != DeviceFormat || got.Name != "d0" {
		t.Errorf("JSON %s: %+v, %v", w.String(), got, err)
	}
	if saved, err := LoadDevice(path); err != nil || saved.Name != "d0" {
		t.Errorf("saved %+v, %v", saved, err)
	}
	w.Reset()
	if err := (Output{W: &w}).Device(d); err != nil || !strings.Contains(w.String(), "d0") || strings.HasPrefix(w.String(), "{") {
		t.Errorf("table %q, %v", w.String(), err)
	}
}
