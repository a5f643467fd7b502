package deploy

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
)

// KEDA's objects, as far as the manifests use them: the fields of KEDA's
// keda.sh/v1alpha1 API (v2.12+), decoded strictly like every other object, so a
// misspelt or misplaced field fails the build's test as the apiserver would refuse it.

type scaledObject struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            scaledObjectSpec  `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef struct {
		APIVersion             string `json:"apiVersion,omitempty"`
		Kind                   string `json:"kind,omitempty"`
		Name                   string `json:"name"`
		EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
	} `json:"scaleTargetRef"`
	PollingInterval       *int32 `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32 `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount      *int32 `json:"idleReplicaCount,omitempty"`
	MinReplicaCount       *int32 `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32 `json:"maxReplicaCount,omitempty"`
	Advanced              *struct {
		RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
		HorizontalPodAutoscalerConfig *struct {
			Name     string                                         `json:"name,omitempty"`
			Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
		} `json:"horizontalPodAutoscalerConfig,omitempty"`
	} `json:"advanced,omitempty"`
	Fallback *struct {
		FailureThreshold int32 `json:"failureThreshold"`
		Replicas         int32 `json:"replicas"`
	} `json:"fallback,omitempty"`
	Triggers []kedaTrigger `json:"triggers"`
}

type kedaTrigger struct {
	Type              string            `json:"type"`
	Name              string            `json:"name,omitempty"`
	UseCachedMetrics  bool              `json:"useCachedMetrics,omitempty"`
	MetricType        string            `json:"metricType,omitempty"`
	Metadata          map[string]string `json:"metadata"`
	AuthenticationRef *struct {
		Name string `json:"name"`
		Kind string `json:"kind,omitempty"`
	} `json:"authenticationRef,omitempty"`
}

type triggerAuthentication struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef,omitempty"`
	} `json:"spec"`
}

// The redis-streams scaler's metadata keys (KEDA's docs, "Redis Streams").
var redisStreamsKeys = map[string]bool{"address": true, "addressFromEnv": true, "host": true, "hostFromEnv": true, "port": true,
	"portFromEnv": true, "usernameFromEnv": true, "passwordFromEnv": true, "stream": true, "consumerGroup": true,
	"pendingEntriesCount": true, "streamLength": true, "lagCount": true, "activationLagCount": true, "enableTLS": true,
	"unsafeSsl": true, "databaseIndex": true}

// The redis-cluster-streams scaler's metadata keys (KEDA's docs, "Redis Streams
// (supports Redis Cluster)"): the redis-streams ones with addresses, hosts and ports for
// address, host and port, and no databaseIndex (a cluster has database 0 only).
var redisClusterStreamsKeys = map[string]bool{"addresses": true, "hosts": true, "ports": true, "usernameFromEnv": true,
	"passwordFromEnv": true, "stream": true, "consumerGroup": true, "pendingEntriesCount": true, "streamLength": true,
	"lagCount": true, "activationLagCount": true, "enableTLS": true, "unsafeSsl": true}

// clusterAddresses are the masters the cluster overlay's triggers read: the example
// cluster of README.md's Secret (redis-0, redis-1, redis-2), to change with it.
const clusterAddresses = "redis-0:6379,redis-1:6379,redis-2:6379"

// Every worker Deployment of the prod overlay has a ScaledObject on each of its input
// streams' lag and pending entries, read as the consumer group the worker reads as, on
// the Valkey its REDIS_URL names, with the TriggerAuthentication's user; KEDA keeps at
// least one worker, and its bound stays within what the agent's RUN_RATE lets start in
// an hour. The cluster overlay has the same, each trigger of KEDA's redis-cluster-streams
// scaler on the masters' addresses. The base and dev (no KEDA needed) have none.
func TestKEDAScaledObjects(t *testing.T) {
	t.Parallel()
	for _, target := range []string{"base", "overlays/dev"} {
		if b := get(t, target); len(b.scaled)+len(b.triggerAuths) != 0 {
			t.Errorf("%s: KEDA objects %v %v; KEDA is the prod overlay's component", target, sortedKeys(b.scaled), sortedKeys(b.triggerAuths))
		}
	}
	base := get(t, "base")
	redisURL, _ := url.Parse(secretValue(base.secrets["ymirflow-redis"], "redis-url"))
	t.Run("prod", func(t *testing.T) {
		t.Parallel()
		checkScaledObjects(t, get(t, "overlays/prod"), scaler{kind: "redis-streams", keys: redisStreamsKeys, addrKey: "address", addr: redisURL.Host})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		b := get(t, "overlays/cluster")
		checkScaledObjects(t, b, scaler{kind: "redis-cluster-streams", keys: redisClusterStreamsKeys, addrKey: "addresses", addr: clusterAddresses})
		if len(b.triggerAuths) != 1 {
			t.Errorf("cluster overlay: TriggerAuthentications %v, want one", sortedKeys(b.triggerAuths))
		}
		readme, err := os.ReadFile("README.md")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(readme, []byte("redis-cluster-streams")) || !bytes.Contains(readme, []byte("keda-cluster-streams.yaml")) {
			t.Error("README.md does not say how the cluster overlay scales (redis-cluster-streams, keda-cluster-streams.yaml)")
		}
	})
}

// scaler is the KEDA scaler an overlay's triggers must be: its type, its metadata
// keys, and the key and value of the server address.
type scaler struct {
	kind          string
	keys          map[string]bool
	addrKey, addr string
}

// checkScaledObjects holds b's ScaledObjects to the worker Deployments, their streams
// and their agents' RUN_RATE.
func checkScaledObjects(t *testing.T, b *build, sc scaler) {
	t.Helper()
	slots := map[string]int{}  // run slots at KEDA's bound, per agent
	budget := map[string]int{} // starts RUN_RATE allows in an hour, per agent
	for _, w := range workers {
		so := b.scaled[w.name]
		if so == nil {
			t.Errorf("no ScaledObject %s", w.name)
			continue
		}
		d := b.deployments[so.Spec.ScaleTargetRef.Name]
		if d == nil || so.Spec.ScaleTargetRef.Kind != "Deployment" || so.Spec.ScaleTargetRef.APIVersion != "apps/v1" {
			t.Errorf("ScaledObject %s: scaleTargetRef %+v is no Deployment of the build", w.name, so.Spec.ScaleTargetRef)
			continue
		}
		if so.Metadata.Namespace != d.Namespace {
			t.Errorf("ScaledObject %s in namespace %q, its Deployment in %q", w.name, so.Metadata.Namespace, d.Namespace)
		}
		minR, maxR := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount
		if minR == nil || maxR == nil || *minR < 1 || *minR > *d.Spec.Replicas || *d.Spec.Replicas > *maxR {
			t.Errorf("ScaledObject %s: min %s, max %s, Deployment replicas %s: want 1 <= min <= replicas <= max",
				w.name, i32(minR), i32(maxR), i32(d.Spec.Replicas))
			continue
		}
		checkTriggers(t, b, so, w.agent, w.branch, sc)

		c := &d.Spec.Template.Spec.Containers[0]
		env := resolveEnv(t, b, c, d.Spec.Template.Spec, d.Name)
		conc := config.DefaultConcurrency
		if v, ok := env["CONCURRENCY"]; ok {
			conc, _ = strconv.Atoi(v)
		}
		slots[w.agent] += int(*maxR) * conc
		if rr, ok := env["RUN_RATE"]; ok {
			r, err := ratelimit.ParseRate(rr)
			if err != nil {
				t.Fatalf("%s: RUN_RATE %q: %v", w.name, rr, err)
			}
			burst := config.DefaultRunRateBurst
			if v, ok := env["RUN_RATE_BURST"]; ok {
				burst, _ = strconv.Atoi(v)
			}
			n := burst + int(time.Hour/r.Per)*r.N
			if old, seen := budget[w.agent]; seen && old != n {
				t.Errorf("%s: RUN_RATE differs between the workers of %s, which share one budget", w.name, w.agent)
			}
			budget[w.agent] = n
		}
	}
	for agent, n := range budget {
		if slots[agent] > n {
			t.Errorf("%s: KEDA may run %d slots (maxReplicaCount x CONCURRENCY over its Deployments), more than the %d starts RUN_RATE allows an hour",
				agent, slots[agent], n)
		}
	}
	for _, agent := range []string{"rebase", "backport", "rebuild"} {
		if _, ok := budget[agent]; !ok {
			t.Errorf("%s: no RUN_RATE: KEDA's bound has no limit to answer to", agent)
		}
	}
}

// checkTriggers holds a ScaledObject's triggers to its worker's input streams.
func checkTriggers(t *testing.T, b *build, so *scaledObject, agent, branch string, sc scaler) {
	t.Helper()
	want := map[string]bool{}
	topo := event.Topology{} // the deployed namespace, ymir (YMIR_NAMESPACE)
	for _, r := range topo.Inputs(agent, branch) {
		want[r.Stream+" lag"], want[r.Stream+" pending"] = true, true
		for _, tr := range so.Spec.Triggers {
			if tr.Metadata["stream"] == r.Stream && tr.Metadata["consumerGroup"] != r.Group {
				t.Errorf("%s: trigger %s reads %s as group %q, the workers' group is %q", so.Metadata.Name, tr.Name, r.Stream, tr.Metadata["consumerGroup"], r.Group)
			}
		}
	}
	for _, tr := range so.Spec.Triggers {
		m := tr.Metadata
		for k := range m {
			if !sc.keys[k] {
				t.Errorf("%s: trigger %s: %q is no %s setting", so.Metadata.Name, tr.Name, k, sc.kind)
			}
		}
		kind := "pending"
		switch {
		case tr.Type != sc.kind:
			t.Errorf("%s: trigger %s of type %q", so.Metadata.Name, tr.Name, tr.Type)
		case m["lagCount"] != "" && m["pendingEntriesCount"] == "":
			kind = "lag" // KEDA reads one count per trigger: lag when lagCount is set
		case m["lagCount"] != "" || m["pendingEntriesCount"] == "":
			t.Errorf("%s: trigger %s: set lagCount or pendingEntriesCount, one per trigger", so.Metadata.Name, tr.Name)
		}
		if !want[m["stream"]+" "+kind] {
			t.Errorf("%s: trigger %s on %s (%s): not an input of the worker, or twice", so.Metadata.Name, tr.Name, m["stream"], kind)
		}
		delete(want, m["stream"]+" "+kind)
		if m[sc.addrKey] != sc.addr {
			t.Errorf("%s: trigger %s reads %s %q, want %q", so.Metadata.Name, tr.Name, sc.addrKey, m[sc.addrKey], sc.addr)
		}
		if tr.AuthenticationRef == nil || b.triggerAuths[tr.AuthenticationRef.Name] == nil {
			t.Errorf("%s: trigger %s: authenticationRef %+v is no TriggerAuthentication of the build", so.Metadata.Name, tr.Name, tr.AuthenticationRef)
		}
	}
	for k := range want {
		t.Errorf("%s: no trigger on %s", so.Metadata.Name, k)
	}
}

// KEDA's TriggerAuthentication reads the Secret ymirflow-redis, keys the prod overlay
// documents, for a user of users.acl whose password is that key's.
func TestKEDATriggerAuthentication(t *testing.T) {
	t.Parallel()
	b := get(t, "overlays/prod")
	sec := get(t, "base").secrets["ymirflow-redis"]
	users := parseACL(t, secretValue(sec, "users.acl"))
	for name, ta := range b.triggerAuths {
		params := map[string]string{}
		for _, r := range ta.Spec.SecretTargetRef {
			if !slicesContains(prodSecrets[r.Name], r.Key) || secretValue(sec, r.Key) == "" {
				t.Errorf("%s: %s from Secret %s key %s: not a documented key of the Secret", name, r.Parameter, r.Name, r.Key)
			}
			params[r.Parameter] = secretValue(sec, r.Key)
		}
		u, ok := users[params["username"]]
		if !ok || !u.on || u.password != params["password"] || !u.leastPrivilege() {
			t.Errorf("%s: user %q with its password is not an enabled least-privilege user of users.acl", name, params["username"])
		}
	}
	if len(b.triggerAuths) != 1 {
		t.Errorf("TriggerAuthentications %v, want one", sortedKeys(b.triggerAuths))
	}
}

// KEDA's user, on a real Redis with users.acl: it reads a group's lag (XINFO GROUPS)
// and pending entries (XPENDING) and nothing else; the workers' user keeps the shared
// rate limits (GCRA's rate:ymir:* and the pauses).
func TestACLKEDAUserAndRateLimitsOnRealRedis(t *testing.T) {
	t.Parallel()
	srv, sec := aclServer(t)
	ctx := context.Background()
	admin := srv.Client()
	stream := event.Topology{}.Stream("rebase", "c9s", false)
	if err := admin.XGroupCreateMkStream(ctx, stream, "rebase-c9s", "0").Err(); err != nil {
		t.Fatal(err)
	}
	admin.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"k": "v"}})
	keda := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: secretValue(sec, "keda-username"), Password: secretValue(sec, "keda-password")})
	t.Cleanup(func() { _ = keda.Close() })
	if err := keda.XPending(ctx, stream, "rebase-c9s").Err(); err != nil {
		t.Errorf("KEDA's XPENDING: %v", err)
	}
	if groups, err := keda.XInfoGroups(ctx, stream).Result(); err != nil || len(groups) != 1 || groups[0].Lag != 1 {
		t.Errorf("KEDA's XINFO GROUPS: %+v %v", groups, err)
	}
	// The cluster overlay's redis-cluster-streams scaler reads the slots' masters first
	// (here a standalone server answers that it is no cluster, not NOPERM).
	for _, cmd := range [][]any{{"CLUSTER", "SLOTS"}, {"CLUSTER", "SHARDS"}} {
		if err := keda.Do(ctx, cmd...).Err(); err != nil && strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("KEDA's user: %v: %v", cmd, err)
		}
	}
	for _, cmd := range [][]any{{"XREADGROUP", "GROUP", "rebase-c9s", "keda", "STREAMS", stream, ">"}, {"XADD", stream, "*", "k", "v"},
		{"XRANGE", stream, "-", "+"}, {"GET", "ymir:x"}, {"KEYS", "*"}, {"CONFIG", "GET", "*"}, {"XINFO", "GROUPS", "other:stream"}} {
		if err := keda.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("KEDA's user: %v: %v, want NOPERM", cmd, err)
		}
	}

	worker := aclClient(t, srv, sec, "redis-url")
	l, err := ratelimit.New(ratelimit.Config{Client: worker, Prefix: "ymir:ratelimit:",
		Limits: map[string]ratelimit.Rate{"jira": {N: 5, Per: time.Second, Burst: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := l.Permit(ctx, "jira"); !ok || err != nil {
		t.Errorf("the workers' user asks the shared Jira budget: %v %v", ok, err)
	}
	if err := l.Throttle(ctx, "jira", time.Second); err != nil {
		t.Errorf("the workers' user pauses the shared Jira budget: %v", err)
	}
	if ok, _, err := l.Permit(ctx, "jira"); ok || err != nil {
		t.Errorf("during the pause: %v %v, want a refusal", ok, err)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
