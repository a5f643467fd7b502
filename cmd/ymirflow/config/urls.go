package config

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/pipeline"
)

// redisURLForm is the expected form of REDIS_URL, for messages about one that is not.
const redisURLForm = "redis://host:6379/0 (in general redis://[user:password@]host:port/db; rediss:// for TLS)"

const redisURLGeneral = "(in general redis://[user:password@]host:port/db; rediss:// for TLS)"

// A Sentinel URL's problems are the client factory's: its message says the form.
func checkSentinelURL(raw string) string {
	if _, err := pipeline.ClientOptions(raw); err != nil {
		return strings.TrimPrefix(err.Error(), "pipeline: Redis URL ")
	}
	return ""
}

// checkRedisURL returns what is wrong with raw as a Redis URL ("" when nothing), value
// (redacted) included, ending with the expected form.
func checkRedisURL(raw string) string {
	if !strings.Contains(raw, "://") {
		// host:port is the usual slip; show it mended (the redaction sees a URL then).
		if mended := redact.URL("redis://" + raw); !strings.HasPrefix(mended, "<") {
			as := mended
			if u, err := url.Parse(mended); err == nil && strings.Trim(u.Path, "/") == "" {
				as = strings.TrimSuffix(mended, "/") + "/0"
			}
			return fmt.Sprintf("= %q has no scheme: write it as %s %s", strings.TrimPrefix(mended, "redis://"),
				as, redisURLGeneral)
		}
		return "is not a URL: write it as " + redisURLForm
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "is not a URL: write it as " + redisURLForm
	}
	shown := fmt.Sprintf("= %q", redact.URL(raw))
	switch u.Scheme {
	case "redis+sentinel", "rediss+sentinel":
		if msg := checkSentinelURL(raw); msg != "" {
			return "= " + msg
		}
	case "redis", "rediss":
		if u.Host == "" {
			return shown + " has no host: write it as " + redisURLForm
		}
		if db := strings.Trim(u.Path, "/"); db != "" {
			if n, err := strconv.Atoi(db); err != nil || n < 0 {
				return shown + " has a database that is not a number: write it as " + redisURLForm
			}
		}
	default:
		return shown + " must start with redis://, rediss://, redis+sentinel:// or rediss+sentinel:// (unix sockets are not supported): write it as " + redisURLForm
	}
	return ""
}

// httpURLProblem returns what is wrong with raw as an http(s) URL ("" when nothing),
// value (redacted) included, with an example of the expected form.
func httpURLProblem(raw, example string) string {
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return ""
	}
	shown := redact.URL(raw)
	if !strings.Contains(raw, "://") {
		if m := redact.URL("https://" + raw); !strings.HasPrefix(m, "<") {
			shown = strings.TrimPrefix(m, "https://")
		}
		if strings.HasPrefix(shown, "<") {
			return "is not a URL: it must be an http:// or https:// URL, e.g. " + example
		}
		return fmt.Sprintf("= %q has no scheme: it must be an http:// or https:// URL, e.g. %s", shown, example)
	}
	if strings.HasPrefix(shown, "<") {
		return "is not a URL: it must be an http:// or https:// URL, e.g. " + example
	}
	return fmt.Sprintf("= %q must be an http:// or https:// URL, e.g. %s", shown, example)
}
