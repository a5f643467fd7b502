package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/webhook"
)

// webhookLimits bound the receiver's connections: Jira's deliveries are small (1 MiB at
// most) and answered within a second.
var webhookLimits = httpsrv.Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
	WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10}

const webhookHelp = `
Receives Jira's webhooks (jira:issue_created, jira:issue_updated) and publishes a
triage request when the issue needs one, through the same rules and lock pre-check
as the fetcher's sweep, until SIGTERM or SIGINT. A comment_created on an issue that
a stage's run holds becomes a follow-up of that run (a comment.created event on the
stream of the entry it works on; ON_CONFLICT=deliver hands it to the running agent),
its text redacted and cut to WEBHOOK_COMMENT_MAX_BYTES; comments by ymirflow's own
account (JIRA_OWN_ACCOUNT) never are. Deliveries must be signed with WEBHOOK_SECRET
(X-Hub-Signature: sha256=...), unless --insecure-no-signature.
`

// runWebhook serves the Jira webhook receiver until SIGTERM/SIGINT, which lets deliveries
// in progress finish.
func runWebhook(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Webhook
	var secret string
	return operator{name: "webhook", settings: &cfg, common: &cfg.Common, jira: &cfg.Jira,
		check: func(s *session) error {
			if err := noArgs("")(s); err != nil {
				return err
			}
			var err error
			secret, err = cfg.Secret()
			return err
		},
		work: func(ctx context.Context, s *session) error { return receive(ctx, s, &cfg, secret) },
	}.run(ctx, args, stdout, stderr)
}

// receive serves the receiver, checking signatures with secret ("": unsigned accepted).
func receive(ctx context.Context, s *session, cfg *config.Webhook, secret string) error {
	e, jc, stdout := s.env, s.jira, s.stdout
	own := cfg.OwnAccounts()
	if len(own) == 0 {
		me, err := jc.Myself(ctx)
		if err != nil {
			return fmt.Errorf("Jira at %s: learn ymirflow's own account (/myself; or set JIRA_OWN_ACCOUNT): %w", redact.URL(cfg.JiraURL), err)
		}
		for _, id := range []string{me.AccountID, me.Name, me.Key} {
			if id != "" {
				own = append(own, id)
			}
		}
	}
	tp, stopTracing, err := startTracing(ctx, &cfg.Tracing, "webhook", e.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	locker, err := e.newLocker(lease.Options{})
	if err != nil {
		return usagef("%v", err)
	}
	f, err := fetcher.New(fetcher.Config{
		Jira: jc, Redis: e.rdb, Topology: e.topology, Locker: locker, MaxLen: cfg.MaxLen, MaxEventBytes: cfg.MaxEventBytes,
		JQL: cfg.JiraJQL, TriggerGroup: cfg.JiraTriggerGroup, StaleLabelThreshold: cfg.StaleLabelThreshold,
		DryRun: cfg.DryRun, Logger: e.log, TracerProvider: tp,
	})
	if err != nil {
		return usagef("%v", err)
	}
	token, err := cfg.Token()
	if err != nil {
		return err
	}
	metrics := pipeline.NewMetrics(e.registry())
	wc := webhook.Config{
		Fetcher: f, Jira: jc, Redis: e.rdb, Topology: e.topology, Secret: []byte(secret),
		InsecureNoSignature: cfg.InsecureNoSignature, OwnAccounts: own, MaxBody: cfg.WebhookMaxBody,
		Deadline: cfg.WebhookDeadline, MaxPayloadAge: cfg.WebhookPayloadAge, DeliveryTTL: cfg.WebhookDeliveryTTL,
		Locker: locker, MaxLen: cfg.MaxLen, CommentMaxBytes: cfg.WebhookCommentMax,
		ApprovalLabelUSD: cfg.WebhookApprovalUSD,
		Redactor:         redact.New(append(ownSecrets(&cfg.Common, token), secret)...),
		Metrics:          webhook.NewMetrics(metrics.Registry), Logger: e.log, TracerProvider: tp,
	}
	if cfg.WebhookCheckScope {
		wc.JQL = cfg.JiraJQL
	}
	rcv, err := webhook.New(wc)
	if err != nil {
		return usagef("%v", err)
	}
	if cfg.MetricsAddr != "" {
		if _, err := (pipeline.Health{Metrics: metrics, Redis: e.rdb}).Serve(ctx, cfg.MetricsAddr); err != nil {
			return listenError("METRICS_ADDR", "metrics-addr", cfg.MetricsAddr, err)
		}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return listenError("ADDR", "addr", cfg.Addr, err)
	}
	hs := httpsrv.New(rcv, webhookLimits)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	// The inbox's classifier: deliveries are answered once stored, classified by Run.
	rctx, stopRun := context.WithCancel(ctx)
	classified := make(chan struct{})
	go func() { defer close(classified); _ = rcv.Run(rctx) }()
	defer func() { stopRun(); <-classified }()
	e.log.Info().Str("addr", ln.Addr().String()).Str("metrics_addr", cfg.MetricsAddr).Bool("signed", secret != "").
		Strs("own_accounts", own).Str("scope", wc.JQL).Str("jira", redact.URL(cfg.JiraURL)).
		Str("redis", cfg.RedactedRedisURL()).Str("namespace", cfg.Namespace).Msg("webhook receiver serving")
	if secret == "" {
		e.log.Warn().Msg("INSECURE_NO_SIGNATURE: unsigned deliveries are accepted; anyone who reaches the port can start triage")
	}
	fmt.Fprintf(stdout, "webhook: receiving Jira webhooks at http://%s/ (%s)\n", ln.Addr(), strings.TrimSpace(signedDesc(secret)))

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("webhook: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("webhook: shutdown: %w", err)
	}
	e.log.Info().Msg("webhook receiver stopped")
	return nil
}

func signedDesc(secret string) string {
	if secret == "" {
		return "UNSIGNED deliveries accepted"
	}
	return "signed deliveries only"
}
