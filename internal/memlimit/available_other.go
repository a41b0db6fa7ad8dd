//go:build !linux

package memlimit

// Available finds no limit outside Linux.
func Available() Limit { return Limit{} }
