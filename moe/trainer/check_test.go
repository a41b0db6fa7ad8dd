package trainer

import (
	"errors"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/launch"
)

// Check names the options a job refuses before it reads anything.
func TestCheck(t *testing.T) {
	cases := []struct {
		c      launch.MoETrainer
		fields []string
	}{
		{launch.MoETrainer{MaxFailedSteps: 2}, []string{"max_failed_steps"}},
		{launch.MoETrainer{Training: launch.Training{Latency: -1}}, []string{"latency", "bandwidth"}},
	}
	for _, tc := range cases {
		var fe *launch.FieldError
		if err := Check(tc.c); !errors.As(err, &fe) || !slices.Equal(fe.Fields, tc.fields) {
			t.Errorf("%+v: got %v, want fields %v", tc.c, err, tc.fields)
		}
		if _, err := NewJob(tc.c, nil); !errors.As(err, &fe) {
			t.Errorf("NewJob(%+v): got %v", tc.c, err)
		}
	}
	if err := Check(launch.MoETrainer{MaxFailedSteps: DefaultMaxFailed}); err != nil {
		t.Error(err)
	}
}
