package bridge

import (
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/averaging/peer"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
)

// specsOf describes a Go model's parameters as a twin's client does.
func specsOf(t *testing.T, m *nn.Sequential) ([]ParamSpec, int) {
	t.Helper()
	var specs []ParamSpec
	total := 0
	for _, p := range m.Params() {
		specs = append(specs, ParamSpec{Name: p.Name, Shape: slices.Clone(p.Value.Shape)})
		total += p.Value.Len()
	}
	return specs, total
}

func TestTwinGetsTheGoPeersSignatureAndInitialWeights(t *testing.T) {
	const spec = "gpt-mini:300x16"
	m, err := models.BuildLM(spec, 9)
	if err != nil {
		t.Fatal(err)
	}
	specs, total := specsOf(t, m)
	data := "bpe-0123456789abcdef"
	sig, init, err := Twin{Model: spec, Data: data, Init: true, Seed: 9}.check(specs, total)
	if err != nil {
		t.Fatal(err)
	}
	if want := peer.ModelSignature(spec, int64(total), data); sig != want {
		t.Errorf("signature %q, want the Go peer's %q", sig, want)
	}
	for i, p := range init.Params() {
		if !slices.Equal(p.Value.Data, m.Params()[i].Value.Data) {
			t.Fatalf("%s: the initial weights differ from a Go peer's of the same seed", p.Name)
		}
	}

	img, err := models.Build("mlp-small", 1)
	if err != nil {
		t.Fatal(err)
	}
	ispecs, itotal := specsOf(t, img)
	if sig, _, err := (Twin{Model: "mlp-small"}).check(ispecs, itotal); err != nil || sig != peer.ModelSignature("mlp-small", int64(itotal), "") {
		t.Errorf("mlp-small twin: %q, %v", sig, err)
	}
}

func TestTwinRefusesAModelThatIsNotTheRegistrys(t *testing.T) {
	m, err := models.BuildLM("gpt-mini:300x16", 1)
	if err != nil {
		t.Fatal(err)
	}
	specs, total := specsOf(t, m)
	swapped := slices.Clone(specs)
	swapped[2], swapped[3] = swapped[3], swapped[2]
	reshaped := slices.Clone(specs)
	fc1 := slices.IndexFunc(specs, func(s ParamSpec) bool { return s.Name == "3.dec.ffn.fc1.weight" })
	reshaped[fc1] = ParamSpec{Name: specs[fc1].Name, Shape: []int{specs[fc1].Shape[1], specs[fc1].Shape[0]}} // torch.nn.Linear's layout
	data := "bpe-0123456789abcdef"
	for _, c := range []struct {
		twin  Twin
		specs []ParamSpec
		total int
		want  string
	}{
		{Twin{Model: "gpt-mini:301x16", Data: data}, specs, total, "parameters"},
		{Twin{Model: "gpt-mini:300x16", Data: data}, swapped, total, "parameter 2"},
		{Twin{Model: "gpt-mini:300x16", Data: data}, reshaped, total, "3.dec.ffn.fc1.weight [512 128]"},
		{Twin{Model: "gpt-mini:300x16"}, specs, total, "data's signature"},
		{Twin{Model: "gpt-mini:300x16", Data: "bpe-x"}, specs, total, "data's signature"},
		{Twin{Model: "bert-tiny"}, specs, total, "no PyTorch twin"},
		{Twin{Model: "deep-mlp:8192x256"}, specs, total, "no PyTorch twin"},
		{Twin{Model: "mlp", Data: data}, specs, total, "takes no data"},
		{Twin{Model: "nonsense"}, specs, total, "unknown model"},
	} {
		if _, _, err := c.twin.check(c.specs, c.total); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one about %q", c.twin, err, c.want)
		}
	}
}
