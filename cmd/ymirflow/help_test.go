package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
)

// Width and size bounds of --help: one short line per setting, the whole text in
// docs/configuration.md.
const (
	maxHelpLine  = 160
	maxHelpBytes = 8000
)

// Issue 36: --help is short per setting. No line of any command's --help is wider
// than maxHelpLine, and no command's --help is longer than maxHelpBytes.
func TestHelpLinesAreShort(t *testing.T) {
	newOpsEnv(t)
	for _, c := range commands() {
		out, _, code := runArgs(c.name, "--help")
		if code != exitOK {
			t.Fatalf("%s --help: exit %d", c.name, code)
		}
		if len(out) > maxHelpBytes {
			t.Errorf("%s --help is %d bytes, more than %d: move the long text to docs/configuration.md", c.name, len(out), maxHelpBytes)
		}
		for _, line := range strings.Split(out, "\n") {
			if n := len([]rune(line)); n > maxHelpLine {
				t.Errorf("%s --help: a line of %d characters, more than %d: give it a short line (config.Short)\n%s", c.name, n, maxHelpLine, line)
			}
		}
		if !strings.Contains(out, "docs/configuration.md") {
			t.Errorf("%s --help does not say where each setting is in full", c.name)
		}
	}
}

// configurationReference is docs/configuration.md: every command's settings in full.
func configurationReference(t *testing.T) []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

Every setting of every command, in full: ` + "`ymirflow COMMAND --help`" + ` prints one short line
per setting, this file the whole text. Every setting is a flag and an environment
variable (the flag wins); "(flag only)" marks the filters and modes of one invocation.
Generated from the code: ` + "`UPDATE_DOCS=1 go test -run TestConfigurationReference ./cmd/ymirflow/`" + `
rewrites it, and the test fails when it is stale.
`)
	for _, c := range commands() {
		s := config.Commands()[c.name]
		if s == nil {
			t.Fatalf("command %s: no settings in config.Commands", c.name)
		}
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		s.Register(fs)
		// The default consumer name is this host's name and pid: the text says so.
		if f := fs.Lookup("consumer-name"); f != nil {
			f.DefValue = ""
		}
		fmt.Fprintf(&b, "\n## ymirflow %s\n\n`ymirflow %s`: %s.\n\n", c.name, c.usage, c.summary)
		config.WriteReference(&b, fs)
	}
	return b.Bytes()
}

// Issue 36: the long explanation of each setting lives in docs/configuration.md, and
// that file is what the code says.
func TestConfigurationReference(t *testing.T) {
	want := configurationReference(t)
	path := filepath.Join("..", "..", "docs", "configuration.md")
	if os.Getenv("UPDATE_DOCS") != "" {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run UPDATE_DOCS=1 go test -run TestConfigurationReference ./cmd/ymirflow/", path)
	}
}
