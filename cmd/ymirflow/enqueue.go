package main

import (
	"context"
	"errors"
	"io"
)

// runEnqueue is not built yet.
func runEnqueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("enqueue: not implemented yet")
}
