package main

import (
	"context"
	"errors"
	"io"
)

// runReplay is not built yet.
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("replay: not implemented yet")
}
