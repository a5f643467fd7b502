package main

import (
	"context"
	"errors"
	"io"
)

// runFetch is not built yet.
func runFetch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("fetch: not implemented yet")
}
