package pipeline_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline"
)

// A RouterConfig that cannot work is refused by NewRouter with an error that names the
// field, never the command line's flag or environment variable (those are the CLI's
// configuration's to name).
func TestRouterConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	valid := func() pipeline.RouterConfig {
		return pipeline.RouterConfig{Client: e.rdb, ClientOptions: e.opts, Topology: e.topo, Agent: "triage",
			Consumer: "w", Locker: e.locker(time.Minute), Handler: func(*message.Message) error { return nil }}
	}
	envName := regexp.MustCompile(`\b[A-Z]+_[A-Z_]+\b`)
	for _, c := range []struct {
		field string
		edit  func(*pipeline.RouterConfig)
	}{
		{"RouterConfig.Client", func(c *pipeline.RouterConfig) { c.Client = nil }},
		{"RouterConfig.Handler", func(c *pipeline.RouterConfig) { c.Handler = nil }},
		{"RouterConfig.Consumer", func(c *pipeline.RouterConfig) { c.Consumer = "" }},
		{"RouterConfig.Agent", func(c *pipeline.RouterConfig) { c.Agent = "nope" }},
		{"RouterConfig.Concurrency", func(c *pipeline.RouterConfig) { c.Concurrency = -1 }},
		{"RouterConfig.BlockTime", func(c *pipeline.RouterConfig) { c.BlockTime = -time.Second }},
		{"RouterConfig.MaxIdleTime", func(c *pipeline.RouterConfig) { c.MaxIdleTime = -time.Second }},
		{"RouterConfig.ClaimInterval", func(c *pipeline.RouterConfig) { c.ClaimInterval = -time.Second }},
		{"RouterConfig.ReadBatch", func(c *pipeline.RouterConfig) { c.ReadBatch = pipeline.MaxReadBatch + 1 }},
		{"RouterConfig.MaxRetries", func(c *pipeline.RouterConfig) { c.MaxRetries = -1 }},
		// A typo of comment.created would leave comments to the default rule.
		{"RouterConfig.Policies entry \"comment.create=deliver\"", func(c *pipeline.RouterConfig) {
			c.Policies = lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Drop},
				ByType: map[string]lockmw.Rule{"comment.create": {Policy: lockmw.Deliver}}}
		}},
	} {
		cfg := valid()
		c.edit(&cfg)
		_, err := pipeline.NewRouter(cfg)
		if err == nil || !strings.Contains(err.Error(), c.field) || envName.MatchString(err.Error()) {
			t.Errorf("%s: NewRouter error %v; want it to name the field and no variable", c.field, err)
		}
	}
	r, err := pipeline.NewRouter(valid())
	if err != nil {
		t.Fatalf("a valid config is refused: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// ClientOptions speaks of the URL it was given, not of the variable a command read it
// from.
func TestClientOptionsErrorsNameNoVariable(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"", "http://h:6379/0", "redis://h:6379/x", "redis://h:6379/0%"} {
		if _, err := pipeline.ClientOptions(raw); err == nil || strings.Contains(err.Error(), "REDIS_URL") {
			t.Errorf("ClientOptions(%q) error %v; want one that names no variable", raw, err)
		}
	}
}
