package alloc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"strings"
)

// The JSON formats are documented in docs/alloc.md.

// DecodeJSON decodes one JSON value from data into v, refusing fields v
// does not have, with errors in the file's terms: the line and column, the
// field's path (e.g. "devices.tflops") and the kind of value expected (a
// number, a list...), never Go's type names.
func DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		// Offset counts the offending byte.
		return fmt.Errorf("%s: %s", position(data, syn.Offset-1), strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &typ):
		what := typ.Field
		if what == "" {
			what = "the file"
		}
		return fmt.Errorf("%s: %s must be %s, not %s", position(data, typ.Offset), what, jsonKind(typ.Type), article(typ.Value))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return fmt.Errorf("%s: the JSON ends early (a missing } or ]?)", position(data, int64(len(data))))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.TrimPrefix(err.Error(), "json: unknown field ") // quoted
		off := int64(bytes.Index(data, []byte(field)))
		if off < 0 {
			off = dec.InputOffset()
		}
		return fmt.Errorf("%s: unknown field %s (docs/alloc.md lists the fields)", position(data, off), field)
	}
	return err
}

// position is "line L, column C" of byte offset off in data (1-based; the
// column counts bytes).
func position(data []byte, off int64) string {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return fmt.Sprintf("line %d, column %d", line, col)
}

// jsonKind names the kind of JSON value that decodes into t.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list [...]"
	case reflect.Struct, reflect.Map:
		return "an object {...}"
	}
	return "another kind of value"
}

// article puts "a" or "an" before the kind of JSON value json reports
// ("string", "number", "array", "object", "bool", or a number's text such
// as "number 1.5").
func article(v string) string {
	switch {
	case v == "array":
		return "a list"
	case v == "object":
		return "an object"
	case v == "bool":
		return "true or false"
	case strings.HasPrefix(v, "number "):
		return strings.TrimPrefix(v, "number ")
	}
	return "a " + v
}

type linkJSON struct {
	LatencyMs     float64 `json:"latency_ms"`
	BandwidthGbit float64 `json:"bandwidth_gbit"`
}

func (l *linkJSON) link() Link {
	if l == nil {
		return Link{}
	}
	return Link{Latency: l.LatencyMs / 1e3, Bandwidth: l.BandwidthGbit * 1e9 / 8}
}

type regionLinkJSON struct {
	A string `json:"a"`
	B string `json:"b"`
	linkJSON
}

type deviceJSON struct {
	Name   string  `json:"name"`
	TFLOPS float64 `json:"tflops"`
	MemGiB float64 `json:"mem_gib"`
	Region string  `json:"region"`
	Count  int     `json:"count"`
}

type clusterJSON struct {
	Intra       *linkJSON        `json:"intra"`
	Inter       *linkJSON        `json:"inter"`
	RegionLinks []regionLinkJSON `json:"region_links"`
	Devices     []deviceJSON     `json:"devices"`
}

// ParseCluster parses a cluster description (see docs/alloc.md).
func ParseCluster(data []byte) (*Cluster, error) {
	var cj clusterJSON
	if err := DecodeJSON(data, &cj); err != nil {
		return nil, fmt.Errorf("alloc: parse cluster: %w", err)
	}
	c := &Cluster{Intra: cj.Intra.link(), Inter: cj.Inter.link()}
	for _, rl := range cj.RegionLinks {
		c.RegionLinks = append(c.RegionLinks, RegionLink{A: rl.A, B: rl.B, Link: rl.link()})
	}
	for i, d := range cj.Devices {
		if d.Count < 0 {
			return nil, fmt.Errorf("alloc: parse cluster: device %d: negative count", i)
		}
		dev := Device{Name: d.Name, Speed: d.TFLOPS * 1e12, MemBytes: int64(d.MemGiB * (1 << 30)), Region: d.Region}
		if dev.Name == "" {
			dev.Name = fmt.Sprintf("dev%d", i)
		}
		if d.Count <= 1 {
			c.Devices = append(c.Devices, dev)
			continue
		}
		for k := 0; k < d.Count; k++ {
			dk := dev
			dk.Name = fmt.Sprintf("%s-%d", dev.Name, k)
			c.Devices = append(c.Devices, dk)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("alloc: parse cluster: %w", err)
	}
	return c, nil
}

// LoadCluster reads and parses a cluster file.
func LoadCluster(path string) (*Cluster, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("alloc: load cluster: %w", err)
	}
	c, err := ParseCluster(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

type layerJSON struct {
	Name            string  `json:"name"`
	FwdFLOPs        float64 `json:"fwd_flops"`
	BwdFLOPs        float64 `json:"bwd_flops"`
	ParamBytes      int64   `json:"param_bytes"`
	ActivationBytes int64   `json:"activation_bytes"`
	OutputBytes     int64   `json:"output_bytes"`
	Count           int     `json:"count"`
}

type modelJSON struct {
	Name         string      `json:"name"`
	Generator    string      `json:"generator"`
	Batch        int         `json:"batch"`
	MicroBatches int         `json:"micro_batches"`
	Layers       []layerJSON `json:"layers"`
}

// ParseModel parses a model description: either JSON (see docs/alloc.md)
// or a bare generator spec such as "bert-large:160".
func ParseModel(data []byte) (*Model, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] != '{' {
		return GenerateModel(string(trimmed), 0, 1)
	}
	var mj modelJSON
	if err := DecodeJSON(data, &mj); err != nil {
		return nil, fmt.Errorf("alloc: parse model: %w", err)
	}
	var m *Model
	switch {
	case mj.Generator != "" && len(mj.Layers) > 0:
		return nil, errors.New("alloc: parse model: give either generator or layers, not both")
	case mj.Generator != "":
		var err error
		if m, err = GenerateModel(mj.Generator, mj.Batch, mj.MicroBatches); err != nil {
			return nil, fmt.Errorf("alloc: parse model: %w", err)
		}
	default:
		m = &Model{Batch: mj.Batch, MicroBatches: max(mj.MicroBatches, 1)}
		for i, l := range mj.Layers {
			if l.Count < 0 {
				return nil, fmt.Errorf("alloc: parse model: layer %d: negative count", i)
			}
			bwd := l.BwdFLOPs
			if bwd == 0 {
				bwd = 2 * l.FwdFLOPs
			}
			layer := Layer{Name: l.Name, FwdFLOPs: l.FwdFLOPs, BwdFLOPs: bwd, ParamBytes: l.ParamBytes,
				ActivationBytes: l.ActivationBytes, OutputBytes: l.OutputBytes}
			if layer.Name == "" {
				layer.Name = fmt.Sprintf("layer%d", i)
			}
			for k := 0; k < max(l.Count, 1); k++ {
				m.Layers = append(m.Layers, layer)
			}
		}
	}
	if mj.Name != "" {
		m.Name = mj.Name
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("alloc: parse model: %w", err)
	}
	return m, nil
}

// LoadModel reads a model file, or, if no such file exists and the
// argument looks like a generator spec ("bert-large:160"), generates it.
func LoadModel(pathOrSpec string) (*Model, error) {
	data, err := os.ReadFile(pathOrSpec)
	if errors.Is(err, fs.ErrNotExist) && bytes.ContainsRune([]byte(pathOrSpec), ':') {
		return GenerateModel(pathOrSpec, 0, 1)
	}
	if err != nil {
		return nil, fmt.Errorf("alloc: load model: %w", err)
	}
	m, err := ParseModel(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pathOrSpec, err)
	}
	return m, nil
}
