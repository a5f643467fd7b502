package config

import (
	"flag"
	"strings"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// Common is the settings of every command that talks to Redis.
type Common struct {
	RedisURL  string // --redis-url, REDIS_URL: redis:// or rediss:// (TLS); user and password may be in the URL
	Namespace string // --ymir-namespace, YMIR_NAMESPACE: prefix of every stream and key
	LogLevel  string // --log-level, LOG_LEVEL: trace|debug|info|warn|error|fatal|panic|disabled
	LogFormat string // --log-format, LOG_FORMAT: json|console
	MaxLen    int64  // --max-len, MAX_LEN: approximate MAXLEN of every stream written (0: never trim)
	// MaxEventBytes (--max-event-bytes, MAX_EVENT_BYTES) bounds one stream entry: bigger
	// ones are refused at publish and dead-lettered (truncated) when read.
	MaxEventBytes int

	emptyRedisOK bool // demo: an empty REDIS_URL means the embedded Redis
}

// Register defines the common flags on fs.
func (c *Common) Register(fs *flag.FlagSet) { c.register(fs, DefaultRedisURL) }

func (c *Common) register(fs *flag.FlagSet, redisDefault string) {
	fs.StringVar(&c.RedisURL, "redis-url", redisDefault, "Redis URL: redis://[user:password@]host:port/db, or rediss:// for TLS; several host:port, comma-separated, for Redis Cluster; "+
		"redis+sentinel://[user:password@]sentinel:26379[,sentinel2:26379]/MASTER_NAME[/db][?sentinel_password=P] for a primary found through Sentinel (rediss+sentinel:// for TLS)")
	fs.StringVar(&c.Namespace, "ymir-namespace", DefaultNamespace, "prefix of every stream and key, so that several pipelines can share one Redis")
	registerLogging(fs, &c.LogLevel, &c.LogFormat)
	fs.Int64Var(&c.MaxLen, "max-len", DefaultMaxLen, "approximate maximum length of every stream written (0: never trim)")
	fs.IntVar(&c.MaxEventBytes, "max-event-bytes", DefaultMaxEventBytes, "largest stream entry (all fields) published or run; a bigger one read from a stream is dead-lettered, truncated")
}

// Validate checks the common settings.
func (c *Common) Validate() error {
	var p problems
	c.validate(&p)
	return p.err()
}

func (c *Common) validate(p *problems) {
	switch {
	case c.RedisURL == "" && c.emptyRedisOK:
	case c.RedisURL == "":
		p.add("redis-url", "is required")
	default:
		if msg := checkRedisURL(c.RedisURL); msg != "" {
			p.add("redis-url", "%s", msg)
		}
	}
	switch {
	case c.Namespace == "":
		p.add("ymir-namespace", "is required")
	case strings.ContainsAny(c.Namespace, "*?[]\\{} \t\r\n"):
		p.add("ymir-namespace", "= %q must not contain spaces, braces or glob characters", c.Namespace)
	}
	validateLogging(p, c.LogLevel, c.LogFormat)
	if c.MaxLen < 0 {
		p.add("max-len", "= %d must not be negative (0 disables trimming)", c.MaxLen)
	}
	if c.MaxEventBytes < MinMaxEventBytes || c.MaxEventBytes > MaxMaxEventBytes {
		p.add("max-event-bytes", "= %d must be between %d and %d", c.MaxEventBytes, MinMaxEventBytes, MaxMaxEventBytes)
	}
}

// Bounds of MAX_EVENT_BYTES: a triage request is a few hundred bytes; Redis's own
// limit on one string is 512 MB.
const (
	MinMaxEventBytes = 4 << 10
	MaxMaxEventBytes = 256 << 20
)

// RedactedRedisURL is RedisURL with its password replaced, for logs and
// error messages.
func (c *Common) RedactedRedisURL() string { return redact.URL(c.RedisURL) }
