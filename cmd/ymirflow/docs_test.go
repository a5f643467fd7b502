package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codePath is a path in backquotes in the docs: a package, a Go file, Lua scripts or a
// folder of the repository (`lockmw/lease`, `lockmw/lease/lease.go`,
// `lockmw/lease/scripts/*.lua`, `integration/`).
var codePath = regexp.MustCompile("`((?:[a-z0-9_]+/)+[a-z0-9_*]*(?:\\.(?:go|lua))?)`")

// Issue 36: the code map and the glossary of docs/development.md name files that exist.
func TestCodeMapPathsExist(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start, end := strings.Index(text, "## Code map"), strings.Index(text, "## Running tests")
	if start < 0 || end < start {
		t.Fatal("docs/development.md: no section Code map (with its Glossary) before Running tests")
	}
	n := 0
	for _, m := range codePath.FindAllStringSubmatch(text[start:end], -1) {
		n++
		matches, err := filepath.Glob(filepath.Join(root, m[1]))
		if err != nil || len(matches) == 0 {
			t.Errorf("docs/development.md names %s, which does not exist", m[1])
		}
	}
	if n < 100 {
		t.Fatalf("docs/development.md: only %d paths in the code map and glossary", n)
	}
}
