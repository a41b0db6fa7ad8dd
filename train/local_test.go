package train

import (
	"slices"
	"strings"
	"testing"
)

func TestClosestModel(t *testing.T) {
	if known, _, _ := ClosestModel("gpt-mini:512x64"); !known {
		t.Error("gpt-mini unknown")
	}
	known, suggest, names := ClosestModel("gpt-mimi")
	if known || suggest != "gpt-mini" || !slices.Contains(names, "mlp") {
		t.Errorf("gpt-mimi: known %v, suggest %q, names %v", known, suggest, names)
	}
	if _, suggest, _ := ClosestModel("resnet"); suggest != "" {
		t.Errorf("resnet: suggest %q", suggest)
	}
}

func TestResultWriteText(t *testing.T) {
	var b strings.Builder
	Result{Epochs: make([]EpochStats, 3), TestAccuracy: 0.8765, Seconds: 12.34, Params: 1000}.WriteText(&b)
	if want := "test accuracy 87.65% after 3 epochs in 12.3s (1000 parameters)\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}
