package main

import (
	"context"
	"errors"
	"io"
)

// runPending is not built yet.
func runPending(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("pending: not implemented yet")
}
