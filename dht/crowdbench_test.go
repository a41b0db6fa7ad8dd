package dht

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkGetCrowdedKey reads a key that holds 1,024 items of other
// writers (what one address may put under a key) and one honest item.
func BenchmarkGetCrowdedKey(b *testing.B) {
	s := newSwarm(b, 2, Config{BucketSize: 5})
	ctx := b.Context()
	far := time.Now().Add(time.Hour)
	for w := range 4 {
		for j := range 256 {
			if _, err := s.nodes[0].Store(ctx, "ffn.", fmt.Sprintf("junk-%d-%d", w, j), []byte("junk"), far); err != nil && j == 0 {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.nodes[1].Get(ctx, "ffn."); err != nil {
			b.Fatal(err)
		}
	}
}
