//go:build !linux

package netem

import (
	"context"
	"errors"
)

var errNoNamespaces = errors.New("netem: network namespaces need Linux")

// NamespaceSupport reports why namespaces cannot be used: they need Linux.
func NamespaceSupport() error { return errNoNamespaces }

// MeasureNamespaces needs Linux; elsewhere it returns an error.
func MeasureNamespaces(ctx context.Context, p LinkParams, o MeasureOptions) (Measurement, error) {
	return Measurement{}, errNoNamespaces
}
