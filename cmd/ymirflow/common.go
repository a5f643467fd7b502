package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/metric"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// env is what every command that talks to Redis starts from.
type env struct {
	log      zerolog.Logger
	rdb      redis.UniversalClient
	opts     *redis.UniversalOptions
	topology event.Topology
	// rateMetrics are the shared rate limits' metrics (JIRA_RATE), when one is set, on
	// reg.
	rateMetrics *ratelimit.Metrics
	// reg is the process's metrics registry, made on first use (registry): the
	// commands with a metrics endpoint (METRICS_ADDR) serve it.
	reg *metric.Registry
}

// registry is the process's metrics registry.
func (e *env) registry() *metric.Registry {
	if e.reg == nil {
		e.reg = metric.NewRegistry()
	}
	return e.reg
}

// sharedLimiter builds the limiter of the budgets every process shares through Redis
// (JIRA_RATE, RUN_RATE), in the namespace's keys, its metrics on e.rateMetrics.
func (e *env) sharedLimiter(limits map[string]ratelimit.Rate) (*ratelimit.Limiter, error) {
	ns := e.topology.Namespace
	if ns == "" {
		ns = event.DefaultNamespace
	}
	if e.rateMetrics == nil {
		e.rateMetrics = ratelimit.NewMetrics(e.registry())
	}
	return ratelimit.New(ratelimit.Config{Client: e.rdb, Prefix: ns + ":ratelimit:", Limits: limits, Metrics: e.rateMetrics})
}

// LimitJira is the name of the shared budget of Jira requests (JIRA_RATE).
const LimitJira = "jira"

// jiraShared is the shared Jira budget of JIRA_RATE, or nil when it is unset.
func (e *env) jiraShared(j *config.Jira) (jira.SharedLimit, error) {
	r, ok := j.SharedRate()
	if !ok {
		return nil, nil
	}
	l, err := e.sharedLimiter(map[string]ratelimit.Rate{LimitJira: r})
	if err != nil {
		return nil, usagef("JIRA_RATE (--jira-rate): %v", err)
	}
	b, err := l.Budget(LimitJira)
	if err != nil {
		return nil, err
	}
	e.log.Info().Str("limit", LimitJira).Str("rate", r.String()).Msg("Jira requests share a budget with every ymirflow process through Redis")
	return b, nil
}

// connect builds the logger and a Redis client that has answered PING. A Redis that
// does not answer PING at start (unreachable, refusing the credentials or the
// database, another TLS) is one clear line naming the cause and the URL without its
// password (exit 1).
func connect(ctx context.Context, c *config.Common, stderr io.Writer) (*env, error) {
	log, err := pipeline.NewLogger(stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return nil, usagef("LOG_LEVEL: %v", err)
	}
	// go-redis logs dial failures itself, unstructured, before we can say anything
	// clearer; route them into our log at debug level. (The library only offers a
	// process-wide setting; cmd owns the process.)
	redis.SetLogger(goRedisLogger{log})
	opts, err := pipeline.ClientOptions(c.RedisURL)
	if err != nil {
		return nil, usagef("%v", err)
	}
	rdb, err := pipeline.Connect(ctx, c.RedisURL)
	if err != nil {
		return nil, connectError(err)
	}
	return &env{log: log, rdb: rdb, opts: opts, topology: event.Topology{Namespace: c.Namespace}}, nil
}

// connectError names the setting and what to do about the cause Connect found (its
// message names the URL without its password): only a server nobody runs needs one
// started.
func connectError(err error) error {
	hint := ""
	switch {
	case errors.Is(err, pipeline.ErrRedisUnreachable):
		hint = " (start a server, e.g. `make redis`, or point REDIS_URL at one)"
	case errors.Is(err, pipeline.ErrRedisAuth):
		hint = "; REDIS_URL carries them as redis://USER:PASSWORD@host:port/db"
	case errors.Is(err, pipeline.ErrRedisNoDB):
		hint = "; REDIS_URL's path is the database, e.g. redis://host:6379/0"
	}
	return fmt.Errorf("REDIS_URL (--redis-url): %w%s", err, hint)
}

func (e *env) Close() { _ = e.rdb.Close() }

// listenError names the setting (env and flag) of a listen address that could not be
// listened on, and the address once: net's message repeats it ("listen tcp ADDR:
// bind: address already in use").
func listenError(env, flagName, addr string, err error) error {
	why := err.Error()
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		why = op.Err.Error()
	}
	msg := fmt.Sprintf("= %s: cannot listen: %s", addr, why)
	if errors.Is(err, syscall.EADDRINUSE) {
		msg += " (another process listens there: stop it, or pick another port; port 0 takes a free one)"
	}
	return &config.SettingError{Env: env, Flag: flagName, Msg: msg}
}

// newLocker returns the process's lease handler with the key layout every command must
// agree on: the namespace's scope, and hash-tagged keys on Redis Cluster.
func (e *env) newLocker(o lease.Options) (*lease.Locker, error) {
	o.Scope = e.topology.LockScope()
	if e.opts.IsClusterMode {
		o.Format = lease.KeysCluster
	}
	o.Logger = e.log
	return lease.New(e.rdb, o)
}

type goRedisLogger struct{ log zerolog.Logger }

func (g goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	g.log.Debug().Str("component", "go-redis").Msgf(format, v...)
}

// ownSecrets are ymirflow's own secrets as this command holds them: the Redis password
// (and a ?password= of the URL) and the Jira token.
func ownSecrets(c *config.Common, jiraToken string) []string {
	out := []string{jiraToken}
	if o, err := pipeline.ClientOptions(c.RedisURL); err == nil {
		out = append(out, o.Password)
	}
	return out
}

// environSecrets are ymirflow's own secrets in the environment: the Redis password of
// REDIS_URL, JIRA_TOKEN and WEB_TOKEN, and the content of JIRA_TOKEN_FILE and WEB_TOKEN_FILE.
func environSecrets(getenv func(string) string) []string {
	out := []string{getenv("JIRA_TOKEN"), getenv("WEB_TOKEN")}
	if o, err := pipeline.ClientOptions(getenv("REDIS_URL")); err == nil {
		out = append(out, o.Password)
	}
	for _, name := range []string{"JIRA_TOKEN_FILE", "WEB_TOKEN_FILE"} {
		if f := getenv(name); f != "" {
			// A file larger than any token is not one: it is not read whole into memory.
			if st, err := os.Stat(f); err == nil && st.Size() <= 64<<10 {
				if s, err := config.ReadSecretFile(f); err == nil {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// connectJira connects to Redis (as connect) and builds the Jira client of the commands
// that search and write (fetch, webhook); a bad Jira setting is a usage error. The
// caller closes the env.
func connectJira(ctx context.Context, c *config.Common, j *config.Jira, stderr io.Writer) (*env, *jira.Client, error) {
	token, err := j.Token()
	if err != nil {
		return nil, nil, err
	}
	e, err := connect(ctx, c, stderr)
	if err != nil {
		return nil, nil, err
	}
	shared, err := e.jiraShared(j)
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	jc, err := jira.New(jira.Options{
		BaseURL: j.JiraURL, Email: j.JiraEmail, Token: token, API: j.APIFlavour(), Shared: shared,
		Timeout: j.JiraTimeout, MaxRetries: j.JiraMaxRetries, RateLimit: j.JiraRateLimit,
		CommentGroup: j.JiraCommentGroup, DryRun: j.DryRun, Logger: e.log,
	})
	if err != nil {
		e.Close()
		return nil, nil, usagef("%v", j.ClientError(err))
	}
	return e, jc, nil
}
