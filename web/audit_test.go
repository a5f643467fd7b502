package web_test

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/web"
)

const (
	viewerToken   = "viewer-token-0123456789"
	operatorToken = "operator-token-0123456789"
	adminToken    = "admin-token-0123456789abc"
)

var operators = []web.Operator{
	{Name: "vera", Role: web.RoleViewer, TokenHash: web.HashToken(viewerToken)},
	{Name: "otto", Role: web.RoleOperator, TokenHash: web.HashToken(operatorToken)},
	{Name: "ada", Role: web.RoleAdmin, TokenHash: web.HashToken(adminToken)},
}

func rolesEnv(t *testing.T) *env { t.Helper(); return newEnvWith(t, web.Config{Operators: operators}) }

const formType = "application/x-www-form-urlencoded"

// writeCase is one request of a write route, with the role it needs and how to see
// whether it acted.
type writeCase struct {
	action, role, contentType string
	body                      func(e *env, reason string) string
	effect                    func(e *env) bool
}

// writeCases are the requests of every write route of the console, by pattern.
// TestEveryConsoleWriteIsAudited fails on a write route missing here.
func writeCases() map[string][]writeCase {
	deadGone := func(e *env) bool { return e.rdb.XLen(context.Background(), e.topo.Dead()).Val() == 0 }
	released := func(e *env) bool { _, err := e.in.Lease(context.Background(), "triage", "RHEL-20"); return err != nil }
	form := func(op string) func(e *env, reason string) string {
		return func(e *env, reason string) string {
			return url.Values{"op": {op}, "id": {e.deadID}, "reason": {reason}}.Encode()
		}
	}
	ids := func(e *env, reason string) string { return `{"ids":["` + e.deadID + `"],"reason":"` + reason + `"}` }
	release := func(e *env, reason string) string {
		return `{"agent":"triage","issue":"RHEL-20","reason":"` + reason + `"}`
	}
	drainN := func(e *env) int64 { return e.rdb.HLen(context.Background(), e.topo.Drains()).Val() }
	drainForm := func(op, target string) func(e *env, reason string) string {
		return func(e *env, reason string) string {
			e.rdb.Del(context.Background(), e.topo.Drains())
			if op == "undrain" {
				e.rdb.HSet(context.Background(), e.topo.Drains(), target, "{}")
			}
			return url.Values{"op": {op}, "target": {target}, "reason": {reason}}.Encode()
		}
	}
	drainJSON := func(e *env, reason string) string {
		e.rdb.Del(context.Background(), e.topo.Drains())
		return `{"agent":"rebase","branch":"c9s","reason":"` + reason + `"}`
	}
	// A pause case's body starts from no pause, a resume case's from the pause set: the
	// effect is then the write's alone.
	pauses := func(e *env) []lease.Pause { ps, _ := e.in.Pauses(context.Background()); return ps }
	paused := func(e *env) bool { return len(pauses(e)) == 1 }
	resumed := func(e *env) bool { return len(pauses(e)) == 0 }
	unpause := func(e *env) { e.rdb.Del(context.Background(), e.locker.Pauses().Keys().Reg) }
	setPause := func(e *env) {
		if _, err := e.locker.Pauses().Set(context.Background(), lease.Pause{Scope: "issue:RHEL-20", Reason: "setup"}); err != nil {
			panic(err)
		}
	}
	pauseForm := func(op string, before func(*env)) func(e *env, reason string) string {
		return func(e *env, reason string) string {
			before(e)
			return url.Values{"op": {op}, "scope": {"issue:rhel-20"}, "reason": {reason}}.Encode()
		}
	}
	pauseJSON := func(before func(*env)) func(e *env, reason string) string {
		return func(e *env, reason string) string {
			before(e)
			return `{"scope":"issue:RHEL-20","reason":"` + reason + `"}`
		}
	}
	return map[string][]writeCase{
		"POST /drain": {{"drain", web.RoleOperator, formType, drainForm("drain", "agent:triage"), func(e *env) bool { return drainN(e) == 1 }},
			{"drain", web.RoleAdmin, formType, drainForm("drain", "all"), func(e *env) bool { return drainN(e) == 1 }},
			{"undrain", web.RoleAdmin, formType, drainForm("undrain", "all"), func(e *env) bool { return drainN(e) == 0 }}},
		"POST /api/v1/drain": {{"drain", web.RoleOperator, "application/json", drainJSON, func(e *env) bool { return drainN(e) == 1 }}},
		"POST /pauses": {{"pause", web.RoleOperator, formType, pauseForm("pause", unpause), paused},
			{"resume", web.RoleOperator, formType, pauseForm("resume", setPause), resumed}},
		"POST /api/v1/pauses":        {{"pause", web.RoleOperator, "application/json", pauseJSON(unpause), paused}},
		"POST /api/v1/pauses/resume": {{"resume", web.RoleOperator, "application/json", pauseJSON(setPause), resumed}},
		"POST /leases/release": {{"release", web.RoleOperator, formType, func(e *env, reason string) string {
			return url.Values{"agent": {"triage"}, "issue": {"RHEL-20"}, "reason": {reason}}.Encode()
		}, released}},
		"POST /dead-letters": {{"requeue", web.RoleOperator, formType, form("requeue"), deadGone},
			{"purge", web.RoleAdmin, formType, form("purge"), deadGone}},
		"POST /api/v1/dead-letters/requeue": {{"requeue", web.RoleOperator, "application/json", ids, deadGone}},
		"POST /api/v1/dead-letters/purge":   {{"purge", web.RoleAdmin, "application/json", ids, deadGone}},
		"POST /api/v1/leases/release":       {{"release", web.RoleOperator, "application/json", release, released}},
	}
}

// notWrites are the routes that take a POST but change nothing of the pipeline.
var notWrites = map[string]bool{"POST /login": true, "POST /logout": true}

// TestEveryConsoleWriteIsAudited walks the console's routes: every route that is not
// a GET is a guarded write (or sign-in/out). For each write: a viewer (and an operator,
// for an admin's write) is refused with 403 and the refusal is recorded; a write
// without a reason is refused naming the field; with the audit stream broken (the
// wrong type) the write is not done; done, it is recorded with who, role, from where
// and why.
func TestEveryConsoleWriteIsAudited(t *testing.T) {
	t.Parallel()
	w := &auditedWrites{t: t, e: rolesEnv(t), ctx: context.Background()}
	e := w.e
	cases := writeCases()
	for _, rt := range e.srv.Routes() {
		method, path, ok := strings.Cut(rt.Pattern, " ")
		if !ok { // a catch-all of any method: it only answers 404
			if code, _, _ := e.do("POST", rt.Pattern+"nope", "{}", map[string]string{"Authorization": "Bearer " + adminToken}); code != 404 {
				t.Errorf("POST to the catch-all %s: %d, want 404", rt.Pattern, code)
			}
			continue
		}
		if method == "GET" || notWrites[rt.Pattern] {
			continue
		}
		if len(rt.Actions) == 0 || cases[rt.Pattern] == nil {
			t.Errorf("%s is a write route without an audited action or a case in writeCases", rt.Pattern)
			continue
		}
		for _, c := range cases[rt.Pattern] {
			w.check(rt.Pattern, path, c)
		}
	}
}

// auditedWrites sends the console's writes as each role and reads the audit trail.
type auditedWrites struct {
	t   *testing.T
	e   *env
	ctx context.Context
}

// tokenOf is each role's bearer token.
var tokenOf = map[string]string{web.RoleViewer: viewerToken, web.RoleOperator: operatorToken, web.RoleAdmin: adminToken}

// setup empties the dead letters and the audit trail, buries one dead letter and makes
// sure RHEL-20's triage lease is held.
func (w *auditedWrites) setup() {
	e, ctx := w.e, w.ctx
	e.rdb.Del(ctx, e.topo.Dead(), e.topo.Audit())
	e.deadID = e.bury("RHEL-20", "boom")
	if _, err := e.in.Lease(ctx, "triage", "RHEL-20"); err != nil {
		if _, err := e.locker.Acquire(ctx, "triage", "RHEL-20", lease.AcquireOptions{Owner: "pod-a", MessageID: "1-0"}); err != nil {
			w.t.Fatal(err)
		}
	}
}

// records reads the audit trail.
func (w *auditedWrites) records() []audit.Record {
	recs, err := w.e.in.Audit(w.ctx, audit.Filter{})
	if err != nil {
		w.t.Fatal(err)
	}
	return recs
}

// send posts c's body with reason to path as role.
func (w *auditedWrites) send(path string, c writeCase, role, reason string) (int, string) {
	code, body, _ := w.e.do("POST", path, c.body(w.e, reason), map[string]string{"Content-Type": c.contentType, "Authorization": "Bearer " + tokenOf[role]})
	return code, body
}

// check sends write c of the route pattern (at path): as each role too weak (403,
// recorded, nothing done), without a reason (400), with the audit stream broken (503,
// not done), and done and recorded.
func (w *auditedWrites) check(pattern, path string, c writeCase) {
	t, e := w.t, w.e
	name := pattern + " " + c.action
	// Too weak a role: 403, recorded, nothing done.
	for _, role := range web.Roles {
		if role == c.role {
			break
		}
		w.setup()
		code, body := w.send(path, c, role, "I want to")
		recs := w.records()
		if code != http.StatusForbidden || !strings.Contains(body, "needs the role "+c.role) || c.effect(e) ||
			len(recs) != 1 || recs[0].Outcome != audit.OutcomeRefused || recs[0].Action != c.action || recs[0].Role != role {
			t.Errorf("%s as %s: %d %.200s, effect %v, audit %+v", name, role, code, body, c.effect(e), recs)
		}
	}
	// No reason: refused, naming the field.
	w.setup()
	if code, body := w.send(path, c, c.role, ""); code != 400 || !strings.Contains(body, "reason") || c.effect(e) {
		t.Errorf("%s without a reason: %d %.200s", name, code, body)
	}
	// The audit stream broken: not done.
	w.setup()
	e.rdb.Set(w.ctx, e.topo.Audit(), "not a stream", 0)
	if code, body := w.send(path, c, c.role, "fault"); code != 503 || !strings.Contains(body, "audit trail could not record") || c.effect(e) {
		t.Errorf("%s with the audit stream broken: %d %.200s, effect %v", name, code, body, c.effect(e))
	}
	// Done and recorded.
	w.setup()
	code, body := w.send(path, c, c.role, "it is stuck")
	recs := w.records()
	if code >= 400 || !c.effect(e) || len(recs) != 1 || recs[0].Outcome != audit.OutcomeDone || recs[0].Action != c.action ||
		recs[0].Reason != "it is stuck" || recs[0].Role != c.role || !strings.HasPrefix(recs[0].From, "console 127.0.0.1:") || recs[0].Scope == "" {
		t.Errorf("%s as %s: %d %.200s, effect %v, audit %+v", name, c.role, code, body, c.effect(e), recs)
	}
}

// TestTrustedProxyIdentity: the proxy's user header names the operator only from a
// trusted address; its role is the operators file's, else viewer; its forms need the
// CSRF token of its pages.
func TestTrustedProxyIdentity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		trusted  string
		user     string
		wantRole string
	}{{"127.0.0.0/8", "otto", web.RoleOperator}, {"127.0.0.0/8", "stranger", web.RoleViewer}, {"10.0.0.0/8", "otto", ""}} {
		e := newEnvWith(t, web.Config{Operators: operators, ProxyUserHeader: "X-Forwarded-User",
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix(c.trusted)}})
		hdr := map[string]string{"X-Forwarded-User": c.user, "X-Forwarded-For": "192.0.2.7"}
		_, page, _ := e.do("GET", "/dead-letters", "", hdr)
		shown := regexp.MustCompile(`id="whoami"[^>]*>([^<]*)<`).FindStringSubmatch(page)
		if c.wantRole == "" {
			if shown != nil {
				t.Errorf("untrusted proxy: the page names %q", shown[1])
			}
			continue
		}
		if shown == nil || shown[1] != c.user+" · "+c.wantRole {
			t.Errorf("trusted proxy, user %s: shown %v, want role %s", c.user, shown, c.wantRole)
			continue
		}
		id := e.bury("RHEL-21", "boom")
		csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
		vals := url.Values{"op": {"requeue"}, "id": {id}, "reason": {"proxy test"}}
		hdr["Content-Type"] = formType
		if code, _, _ := e.do("POST", "/dead-letters", vals.Encode(), hdr); code != 403 {
			t.Errorf("proxy user %s without CSRF: %d, want 403", c.user, code)
		}
		vals.Set("csrf", csrf[1])
		code, _, _ := e.do("POST", "/dead-letters", vals.Encode(), hdr)
		recs, _ := e.in.Audit(context.Background(), audit.Filter{})
		if len(recs) != 1 || recs[0].Who != c.user || recs[0].From != "console 192.0.2.7 via proxy "+recs[0].From[len("console 192.0.2.7 via proxy "):] {
			t.Errorf("proxy user %s: %d, audit %+v", c.user, code, recs)
		}
		if wantCode := map[string]int{web.RoleOperator: 303, web.RoleViewer: 403}[c.wantRole]; code != wantCode {
			t.Errorf("proxy user %s (%s) requeue: %d, want %d", c.user, c.wantRole, code, wantCode)
		}
	}
}

// TestOperatorsFile: the file's lines, and what is refused, named by line.
func TestOperatorsFile(t *testing.T) {
	t.Parallel()
	ops, err := web.ParseOperators(strings.NewReader("# ops\n\nalice admin " + web.HashToken("x") + "\nbob viewer\n"))
	if err != nil || len(ops) != 2 || ops[0].Role != "admin" || ops[1].TokenHash != "" {
		t.Fatalf("ParseOperators = %+v, %v", ops, err)
	}
	for in, says := range map[string]string{"alice\n": "line 1", "alice boss\n": "role \"boss\"", "a b c d\n": "4 fields",
		"alice admin plaintext-token\n": "sha256:", "a viewer\na admin\n": "named twice", "../x viewer\n": "letters, digits"} {
		if _, err := web.ParseOperators(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseOperators(%q) = %v, want saying %q", in, err, says)
		}
	}
}
