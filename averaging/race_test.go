//go:build race

package averaging

func init() { raceEnabled = true }
