//go:build !unix

package p2p

// fileLimit is a conservative limit on open files where it cannot be read.
func fileLimit() int { return 1024 }
