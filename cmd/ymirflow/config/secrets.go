package config

import (
	"errors"
	"os"
	"strings"
)

// ReadSecretFile is the one reader of ymirflow's secret files (JIRA_TOKEN_FILE,
// WEB_TOKEN_FILE, WEBHOOK_SECRET_FILE): the file's content with surrounding whitespace
// trimmed, as a mounted Kubernetes secret or an editor leaves it. The error is the file
// system's, without the operation and path (the messages name the setting and its value).
func ReadSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", unwrapPathErr(err)
	}
	return strings.TrimSpace(string(b)), nil
}

// unwrapPathErr drops the operation and path of a file error: the messages name the
// setting and its value already.
func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
