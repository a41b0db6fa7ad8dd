package tensor

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves goroutines behind (the parallel GEMM
// starts workers on every large call).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
