package main

import (
	"context"
	"errors"
	"io"
)

// runFakeJira is not built yet.
func runFakeJira(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("fakejira: not implemented yet")
}
