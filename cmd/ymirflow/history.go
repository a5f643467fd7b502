package main

import (
	"context"
	"errors"
	"io"
)

// runHistory is not built yet.
func runHistory(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("history: not implemented yet")
}
