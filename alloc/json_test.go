package alloc

import (
	"strings"
	"testing"
)

// TestJSONErrorsInFileTerms checks that malformed cluster and model files
// are reported with their line and column and the field's path, in words
// that name no Go type.
func TestJSONErrorsInFileTerms(t *testing.T) {
	cases := []struct {
		model bool
		text  string
		want  []string
	}{
		{false, "{\n  \"devices\": [\n    {\"name\": \"a\", \"tflops\": \"fast\"}\n  ]\n}",
			[]string{"line 3, column", "devices.tflops must be a number, not a string"}},
		{false, "{\n  \"devices\": [\n    {\"name\": \"a\", \"tflops\": 10},\n  ]\n}",
			[]string{"line 4, column 3:", "invalid character ']'"}},
		{false, "{\n  \"devices\": [\n    {\"name\": \"a\", \"tflop\": 10}\n  ]\n}",
			[]string{"line 3, column 19:", `unknown field "tflop"`}},
		{false, `{"devices": [{"name": "a", "count": 1.5}]}`,
			[]string{"line 1, column", "devices.count must be a whole number, not 1.5"}},
		{false, `{"devices": {"name": "a"}}`,
			[]string{"devices must be a list [...], not an object"}},
		{false, `{"devices": [{"name": "a"}`,
			[]string{"line 1, column 27:", "ends early"}},
		{true, "\n\n{\"layers\": [{\"fwd_flops\": true}]}",
			[]string{"line 3, column", "layers.fwd_flops must be a number, not true or false"}},
	}
	for _, c := range cases {
		var err error
		if c.model {
			_, err = ParseModel([]byte(c.text))
		} else {
			_, err = ParseCluster([]byte(c.text))
		}
		if err == nil {
			t.Errorf("%q accepted", c.text)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %q lacks %q", c.text, err, w)
			}
		}
		for _, goWord := range []string{"float64", " int", "Go ", "struct", "JSON."} {
			if strings.Contains(err.Error(), goWord) {
				t.Errorf("%q: %q names Go's %q", c.text, err, goWord)
			}
		}
	}
}
