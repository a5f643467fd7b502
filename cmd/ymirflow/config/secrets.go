package config

import (
	"errors"
	"os"
)

// unwrapPathErr drops the operation and path of a file error: the messages name the
// setting and its value already.
func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
