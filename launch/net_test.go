package launch

import (
	"errors"
	"strings"
	"testing"
)

func TestSeedsErrorNamesField(t *testing.T) {
	_, err := (Net{DHT: []string{"x"}}).Seeds()
	var fe *FieldError
	if !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), "dht: ") {
		t.Errorf("bad dht: %v", err)
	}
	if r := fe.Renamed(strings.ToUpper).Error(); !strings.HasPrefix(r, "DHT: ") {
		t.Errorf("renamed: %q", r)
	}
}
