package main

import (
	"context"
	"errors"
	"io"
)

// runDLQ is not built yet.
func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("dlq: not implemented yet")
}
