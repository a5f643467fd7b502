package main

import (
	"context"
	"errors"
	"io"
)

// runStreams is not built yet.
func runStreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("streams: not implemented yet")
}
