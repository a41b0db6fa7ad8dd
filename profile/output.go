package profile

import (
	"encoding/json"
	"fmt"
	"io"
)

// Output is where the profile commands put a profile: saved to the file
// Out if it is set (Save), which is then announced on Log, and printed on
// W as a table or, with JSON, as JSON.
type Output struct {
	W, Log io.Writer
	Out    string
	JSON   bool
}

// Device saves and prints a device profile; its JSON has the format tag
// of the saved file.
func (o Output) Device(d Device) error {
	if err := o.save(func() error { return SaveDevice(o.Out, d) }); err != nil {
		return err
	}
	if o.JSON {
		return writeJSON(o.W, deviceFile{Format: DeviceFormat, Device: d})
	}
	return WriteDevice(o.W, d)
}

// Model saves and prints a model profile.
func (o Output) Model(m *ModelProfile) error {
	if err := o.save(func() error { return Save(o.Out, m) }); err != nil {
		return err
	}
	if o.JSON {
		return writeJSON(o.W, m)
	}
	return WriteModel(o.W, m)
}

// Cluster saves a cluster profile, or prints it as JSON when Out is not
// set.
func (o Output) Cluster(c *ClusterProfile) error {
	if o.Out == "" {
		return writeJSON(o.W, c)
	}
	return o.save(func() error { return Save(o.Out, c) })
}

// save runs save when Out is set and says so on Log.
func (o Output) save(save func() error) error {
	if o.Out == "" {
		return nil
	}
	if err := save(); err != nil {
		return err
	}
	if o.Log != nil {
		fmt.Fprintf(o.Log, "wrote %s\n", o.Out)
	}
	return nil
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
