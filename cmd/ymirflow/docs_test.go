package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/lockmw"
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

// The glossary of docs/development.md has a row for every busy policy the middleware
// parses (a new policy comes with its term).
func TestGlossaryNamesEveryPolicy(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "## Glossary")
	if start < 0 {
		t.Fatal("docs/development.md: no Glossary")
	}
	glossary := text[start:]
	policyRow, _, _ := strings.Cut(glossary[strings.Index(glossary, "\n| policy |")+1:], "\n")
	for _, p := range []lockmw.Policy{lockmw.Drop, lockmw.Coalesce, lockmw.Deliver, lockmw.Delay, lockmw.Supersede, lockmw.Wait} {
		if !strings.Contains(glossary, "\n| "+string(p)+" |") {
			t.Errorf("the glossary has no row for the busy policy %s", p)
		}
		if !strings.Contains(policyRow, string(p)) {
			t.Errorf("the glossary's policy row %q does not list %s", policyRow, p)
		}
	}
}

// goFile is a Go file's name in a doc comment.
var goFile = regexp.MustCompile(`\b[a-z0-9_]+\.go\b`)

// Issue 36: a package doc whose "Files:" list names its files names every file of the
// package, and only files that exist (two such lists had gone stale).
func TestDocFilesListsAreTrue(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "*", "*", "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join(root, "*", "doc.go"))
	checked := 0
	for _, doc := range append(docs, more...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "Files:") {
			continue
		}
		checked++
		dir := filepath.Dir(doc)
		named := map[string]bool{}
		for _, f := range goFile.FindAllString(string(b), -1) {
			named[f] = true
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("%s names %s, which does not exist", doc, f)
			}
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if base := filepath.Base(f); !strings.HasSuffix(base, "_test.go") && !named[base] {
				t.Errorf("%s: its Files list does not name %s", doc, base)
			}
		}
	}
	if checked < 2 {
		t.Fatalf("only %d package docs with a Files list (lockmw, lockmw/lease have one)", checked)
	}
}
