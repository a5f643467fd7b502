package main

import (
	"context"
	"errors"
	"io"
)

// runWorker is not built yet.
func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("worker: not implemented yet")
}
