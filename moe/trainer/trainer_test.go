package trainer

import (
	"errors"
	"strings"
	"testing"
)

// TestMoEFailedStepsFailTheRun checks the verdict on a finished MoE run:
// more than --max-failed-steps of failed steps is an error that counts
// them and gives the cause once; fewer is a note.
func TestMoEFailedStepsFailTheRun(t *testing.T) {
	cause := errors.New("expert ffn.12.5 wants [batch, hidden] with hidden 1024")
	var log strings.Builder
	err := CheckFailures(&log, Result{Steps: 40, Failed: 37, Err: cause}, DefaultMaxFailed)
	if err == nil || !errors.Is(err, cause) || !strings.Contains(err.Error(), "37 of 40 steps failed") ||
		!strings.Contains(err.Error(), "--max-failed-steps 0.1") || strings.Count(err.Error(), "wants [batch") != 1 {
		t.Fatalf("37 of 40 steps failed: %v", err)
	}
	if err := CheckFailures(&log, Result{Steps: 40, Failed: 3, Err: cause}, DefaultMaxFailed); err != nil {
		t.Fatalf("3 of 40 steps failed (7.5%%): %v", err)
	}
	if !strings.Contains(log.String(), "3 of 40 steps failed (within --max-failed-steps 0.1)") {
		t.Fatalf("no note of the failed steps: %q", log.String())
	}
	if err := CheckFailures(&log, Result{Steps: 40}, DefaultMaxFailed); err != nil {
		t.Fatal(err)
	}
}
