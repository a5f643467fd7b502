package main

import (
	"context"
	"errors"
	"io"
)

// runLocks is not built yet.
func runLocks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("locks: not implemented yet")
}
