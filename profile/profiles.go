package profile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/skyhive/skyhive/alloc"
)

// Format tags of the JSON profiles; a file's "format" field names its kind
// and version.
const (
	DeviceFormat  = "skyhive-device-profile/1"
	ClusterFormat = "skyhive-cluster-profile/1"
	ModelFormat   = "skyhive-model-profile/1"
)

// ModelProfile is a model's per-layer profile for one batch.
type ModelProfile struct {
	// Format is ModelFormat.
	Format string `json:"format"`
	// Name is informative.
	Name string `json:"name"`
	// Batch is the samples per iteration; InShape the input shape
	// (batch first). Layer costs are for the whole batch.
	Batch   int   `json:"batch"`
	InShape []int `json:"in_shape,omitempty"`
	// Backend and CPUs describe the machine of measured times, if any.
	Backend string `json:"backend,omitempty"`
	CPUs    int    `json:"cpus,omitempty"`
	// Layers in execution order.
	Layers []Layer `json:"layers"`
}

// Totals sums the layers' costs. FwdSeconds and BwdSeconds are the sums of
// the measured times.
func (m *ModelProfile) Totals() Layer {
	var t Layer
	t.Name = "total"
	for _, l := range m.Layers {
		t.FwdFLOPs += l.FwdFLOPs
		t.BwdFLOPs += l.BwdFLOPs
		t.Params += l.Params
		t.ParamBytes += l.ParamBytes
		t.ActivationBytes += l.ActivationBytes
		t.FwdSeconds += l.FwdSeconds
		t.BwdSeconds += l.BwdSeconds
	}
	if n := len(m.Layers); n > 0 {
		t.OutShape = slices.Clone(m.Layers[n-1].OutShape)
		t.OutputBytes = m.Layers[n-1].OutputBytes
	}
	return t
}

// Measured reports whether every layer has measured times.
func (m *ModelProfile) Measured() bool {
	return len(m.Layers) > 0 && !slices.ContainsFunc(m.Layers, func(l Layer) bool { return l.FwdSeconds <= 0 || l.BwdSeconds <= 0 })
}

// Alloc converts the profile to an allocator model with counted FLOPs and
// the given number of micro-batches (≤ 1: the sequential schedule).
func (m *ModelProfile) Alloc(micro int) *alloc.Model {
	am := &alloc.Model{Name: m.Name, Batch: m.Batch, MicroBatches: max(micro, 0)}
	for _, l := range m.Layers {
		am.Layers = append(am.Layers, l.Alloc())
	}
	return am
}

// AllocTimed converts the profile to an allocator model whose FLOPs are the
// measured times multiplied by speed, the FLOP/s of the device that measured
// them (its Device.MeasuredSpeed). On that device the allocator then predicts
// the measured times, and on a device k times faster, times k times
// shorter; layers that run below GEMM speed (attention, element-wise work)
// weigh what they really cost.
func (m *ModelProfile) AllocTimed(micro int, speed float64) (*alloc.Model, error) {
	if !(speed > 0) {
		return nil, fmt.Errorf("profile: speed %v FLOP/s must be positive", speed)
	}
	if !m.Measured() {
		return nil, fmt.Errorf("profile: model %q has layers without measured times", m.Name)
	}
	am := m.Alloc(micro)
	for i, l := range m.Layers {
		am.Layers[i].FwdFLOPs = l.FwdSeconds * speed
		am.Layers[i].BwdFLOPs = l.BwdSeconds * speed
	}
	return am, nil
}

// Validate checks that the profile can be planned with.
func (m *ModelProfile) Validate() error {
	if m.Format != ModelFormat {
		return fmt.Errorf("profile: model profile format %q, want %q", m.Format, ModelFormat)
	}
	if len(m.Layers) == 0 {
		return errors.New("profile: model profile has no layers")
	}
	for i, l := range m.Layers {
		if l.FwdFLOPs < 0 || l.BwdFLOPs < 0 || l.Params < 0 || l.ParamBytes < 0 || l.ActivationBytes < 0 || l.OutputBytes < 0 || l.FwdSeconds < 0 || l.BwdSeconds < 0 {
			return fmt.Errorf("profile: layer %d (%q): negative cost", i, l.Name)
		}
	}
	return nil
}

// LinkSpec is a link entered by hand: the default for pairs of devices whose
// link was not measured.
type LinkSpec struct {
	// Latency is one-way, in seconds.
	Latency float64 `json:"latency_s"`
	// Bandwidth is in bytes per second; 0 means unlimited.
	Bandwidth float64 `json:"bandwidth_bytes_per_s"`
}

// ClusterProfile is a set of device profiles and measured links.
type ClusterProfile struct {
	// Format is ClusterFormat.
	Format string `json:"format"`
	// Devices in pipeline order (the order "even" and "sky" use).
	Devices []Device `json:"devices"`
	// Links measured between devices, in either direction.
	Links []Link `json:"links,omitempty"`
	// Intra and Inter are the links assumed between devices with no
	// measured link: within one region and across regions.
	Intra LinkSpec `json:"intra"`
	Inter LinkSpec `json:"inter"`
}

// Alloc converts the profile to an allocator cluster.
//
// The allocator knows links between regions, not devices. A device without
// a region is put in a region of its own named after it, so its measured
// links are kept as they are. The links measured between two regions (in
// either direction, or within one region) become that pair's link with the
// median latency and the median bandwidth of those measurements; pairs with
// no measurement use Intra or Inter.
func (p *ClusterProfile) Alloc() (*alloc.Cluster, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c := &alloc.Cluster{
		Intra: alloc.Link{Latency: p.Intra.Latency, Bandwidth: p.Intra.Bandwidth},
		Inter: alloc.Link{Latency: p.Inter.Latency, Bandwidth: p.Inter.Bandwidth},
	}
	region := map[string]string{} // device name or peer ID → region
	for _, d := range p.Devices {
		ad := d.Alloc()
		if ad.Region == "" {
			ad.Region = d.Name
		}
		c.Devices = append(c.Devices, ad)
		region[d.Name] = ad.Region
		if d.Peer != "" {
			region[d.Peer] = ad.Region
		}
	}
	type pair struct{ a, b string }
	lat := map[pair][]float64{}
	bw := map[pair][]float64{}
	var order []pair
	for _, l := range p.Links {
		a, b := region[l.From], region[l.To]
		if b < a {
			a, b = b, a
		}
		k := pair{a, b}
		if _, seen := lat[k]; !seen {
			order = append(order, k)
		}
		lat[k] = append(lat[k], l.Latency)
		if l.Bandwidth > 0 {
			bw[k] = append(bw[k], l.Bandwidth)
		}
	}
	for _, k := range order {
		var link alloc.Link
		link.Latency, _, _ = medianMinMax(lat[k])
		if len(bw[k]) > 0 {
			link.Bandwidth, _, _ = medianMinMax(bw[k])
		}
		c.RegionLinks = append(c.RegionLinks, alloc.RegionLink{A: k.a, B: k.b, Link: link})
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	return c, nil
}

// Validate checks the devices and that every link names known devices.
func (p *ClusterProfile) Validate() error {
	if p.Format != ClusterFormat {
		return fmt.Errorf("profile: cluster profile format %q, want %q", p.Format, ClusterFormat)
	}
	if len(p.Devices) == 0 {
		return errors.New("profile: cluster profile has no devices")
	}
	known := map[string]bool{}
	for _, d := range p.Devices {
		if err := d.Validate(); err != nil {
			return err
		}
		if known[d.Name] {
			return fmt.Errorf("profile: duplicate device name %q", d.Name)
		}
		known[d.Name] = true
	}
	for _, d := range p.Devices {
		if d.Peer != "" {
			if known[d.Peer] && d.Peer != d.Name {
				return fmt.Errorf("profile: peer ID %q of device %q is also another device's name or peer", d.Peer, d.Name)
			}
			known[d.Peer] = true
		}
	}
	for _, s := range []LinkSpec{p.Intra, p.Inter} {
		if s.Latency < 0 || s.Bandwidth < 0 {
			return errors.New("profile: negative default link latency or bandwidth")
		}
	}
	for i, l := range p.Links {
		switch {
		case !known[l.From] || !known[l.To]:
			return fmt.Errorf("profile: link %d from %q to %q names an unknown device", i, l.From, l.To)
		case l.Latency < 0 || l.Bandwidth < 0:
			return fmt.Errorf("profile: link %d from %q to %q: negative latency or bandwidth", i, l.From, l.To)
		}
	}
	return nil
}

// Save writes v (a profile) as indented JSON to path atomically: a
// temporary file in the same directory, synced, then renamed over path.
func Save(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("profile: encoding %s: %w", path, err)
	}
	data = append(data, '\n')
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("profile: saving %s: %w", path, err)
	}
	return nil
}

// decode parses strict JSON (unknown fields are errors) into v.
func decode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// deviceFile is a device profile on disk: the device with a format tag.
type deviceFile struct {
	Format string `json:"format"`
	Device
}

// SaveDevice writes a device profile to path (see Save).
func SaveDevice(path string, d Device) error {
	return Save(path, deviceFile{Format: DeviceFormat, Device: d})
}

// ParseDevice parses a device profile.
func ParseDevice(data []byte) (Device, error) {
	var f deviceFile
	if err := decode(data, &f); err != nil {
		return Device{}, fmt.Errorf("profile: device profile: %w", err)
	}
	if f.Format != DeviceFormat {
		return Device{}, fmt.Errorf("profile: device profile format %q, want %q", f.Format, DeviceFormat)
	}
	if err := f.Device.Validate(); err != nil {
		return Device{}, err
	}
	return f.Device, nil
}

// LoadDevice reads a device profile.
func LoadDevice(path string) (Device, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Device{}, fmt.Errorf("profile: %w", err)
	}
	d, err := ParseDevice(data)
	if err != nil {
		return Device{}, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// LoadOrMeasureDevice returns the device profile cached at path, or, if there
// is no such file, measures this machine and saves the profile there. A
// cached profile takes o's Name, Region, Peer, MemCapBytes and Slowdown
// where they are set, so a cache can be shared by emulated devices.
func LoadOrMeasureDevice(ctx context.Context, path string, o DeviceOptions) (Device, error) {
	d, err := LoadDevice(path)
	if errors.Is(err, fs.ErrNotExist) {
		d, err = MeasureDevice(ctx, o)
		if err != nil {
			return Device{}, err
		}
		return d, SaveDevice(path, d)
	}
	if err != nil {
		return Device{}, err
	}
	if o.Name != "" {
		d.Name = o.Name
	}
	if o.Region != "" {
		d.Region = o.Region
	}
	if o.Peer != "" {
		d.Peer = o.Peer
	}
	if o.MemCapBytes > 0 {
		d.MemCapBytes = o.MemCapBytes
		d.MemBytes = o.MemCapBytes
		if d.MemAvailableBytes > 0 {
			d.MemBytes = min(d.MemAvailableBytes, o.MemCapBytes)
		}
	}
	if o.Slowdown < 0 {
		return Device{}, fmt.Errorf("profile: negative slowdown %v", o.Slowdown)
	}
	if o.Slowdown > 0 && d.MeasuredSpeed > 0 {
		d.Slowdown = o.Slowdown
		d.Speed = d.MeasuredSpeed / o.Slowdown
	}
	return d, nil
}

// ParseCluster parses a cluster profile.
func ParseCluster(data []byte) (*ClusterProfile, error) {
	var p ClusterProfile
	if err := decode(data, &p); err != nil {
		return nil, fmt.Errorf("profile: cluster profile: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// ParseModel parses a model profile.
func ParseModel(data []byte) (*ModelProfile, error) {
	var m ModelProfile
	if err := decode(data, &m); err != nil {
		return nil, fmt.Errorf("profile: model profile: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// formatOf returns the "format" field of a JSON object, or "" if data is not
// an object with a string format.
func formatOf(data []byte) string {
	var f struct {
		Format string `json:"format"`
	}
	if json.Unmarshal(data, &f) != nil {
		return ""
	}
	return f.Format
}

// LoadCluster reads a cluster for the allocator from path: either a cluster
// profile (format ClusterFormat), or a device profile (a cluster of one), or
// an alloc cluster file (docs/alloc.md).
func LoadCluster(path string) (*alloc.Cluster, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	var c *alloc.Cluster
	switch formatOf(data) {
	case ClusterFormat:
		var p *ClusterProfile
		if p, err = ParseCluster(data); err == nil {
			c, err = p.Alloc()
		}
	case DeviceFormat:
		var d Device
		if d, err = ParseDevice(data); err == nil {
			c, err = (&ClusterProfile{Format: ClusterFormat, Devices: []Device{d}}).Alloc()
		}
	default:
		c, err = alloc.ParseCluster(data)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// LoadModel reads a model for the allocator: a model profile file (format
// ModelFormat, counted FLOPs), or whatever alloc.LoadModel accepts (an alloc
// model file or a generator spec such as "bert-large:160").
func LoadModel(pathOrSpec string) (*alloc.Model, error) {
	data, err := os.ReadFile(pathOrSpec)
	if err == nil && formatOf(data) == ModelFormat {
		m, err := ParseModel(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pathOrSpec, err)
		}
		return m.Alloc(0), nil
	}
	return alloc.LoadModel(pathOrSpec)
}
