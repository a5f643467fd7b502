package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// testKitEnv are the variables a test kit outside _test.go files reads on its own
// account: redistest finds the tests' Redis through REDIS_URL, as the tests' environment
// (not the binary's) sets it.
var testKitEnv = map[string][]string{
	"internal/redistest/redistest.go": {"REDIS_URL"},
}

// envToken is a run of the characters an environment variable's name is made of: a
// literal names a variable when one of its runs is that name (YMIR_AGENT, the runner's
// own variable, does not name AGENT).
var envToken = regexp.MustCompile(`[A-Z][A-Z0-9_]*`)

// Only the configuration package and cmd/ speak flags and environment variables: no
// string literal of the module's other non-test code names a variable that some
// command reads (the list is the settings table's own, EnvNames).
func TestOnlyTheCLINamesEnvironmentVariables(t *testing.T) {
	t.Parallel()
	root := redistest.ModuleRoot(t)
	names := EnvNames()
	allowed := map[string]map[string]bool{}
	for file, envs := range testKitEnv {
		allowed[file] = map[string]bool{}
		for _, e := range envs {
			allowed[file][e] = true
		}
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor" || rel == "cmd") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, w := range envToken.FindAllString(s, -1) {
				if _, ok := names[w]; !ok {
					continue
				}
				if !allowed[rel][w] {
					t.Errorf("%s: the string %q names the environment variable %s: name the field instead; only cmd/ymirflow/config (and cmd/) speaks flags and variables", rel, clipLit(s), w)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func clipLit(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
