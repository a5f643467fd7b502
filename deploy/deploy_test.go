package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
)

// targets are the kustomizations under test; dev and prod are what operators
// apply, base is checked too because both are built on it.
var targets = []string{"base", "overlays/dev", "overlays/prod"}

// workers are the agent Deployments that issue 9 asks for, with the replicas
// of the base (and prod); dev runs one of each.
// workerSpec is one worker Deployment the overlays must build.
type workerSpec struct {
	name, agent, branch string
	replicas            int32
}

var workers = []workerSpec{
	{"ymirflow-triage", "triage", "", 2},
	{"ymirflow-rebase-c9s", "rebase", "c9s", 2},
	{"ymirflow-rebase-c10s", "rebase", "c10s", 2},
	{"ymirflow-backport-c9s", "backport", "c9s", 4},
	{"ymirflow-backport-c10s", "backport", "c10s", 4},
	{"ymirflow-rebuild-c9s", "rebuild", "c9s", 2},
	{"ymirflow-rebuild-c10s", "rebuild", "c10s", 2},
}

// prodSecrets are the Secrets that the prod overlay expects to exist in the
// cluster (it does not ship them); README.md must say how to create them.
var prodSecrets = map[string][]string{
	"ymirflow-redis":   {"users.acl", "redis-url", "operator-url", "operator-password", "keda-username", "keda-password"},
	"ymirflow-jira":    {"token"},
	"ymirflow-webhook": {"secret"},
}

const graceSeconds = 90

// build is one kustomization's output, decoded strictly.
type build struct {
	target       string
	raw          []byte // the whole output as JSON lines, for text searches
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	cronJobs     map[string]*batchv1.CronJob
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	netPols      map[string]*networkingv1.NetworkPolicy
	pdbs         map[string]*policyv1.PodDisruptionBudget
	accounts     map[string]*corev1.ServiceAccount
	scaled       map[string]*scaledObject          // KEDA (keda_test.go)
	triggerAuths map[string]*triggerAuthentication // KEDA
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]*build{}
)

// kinds maps apiVersion/kind to a new typed object and the build's map it goes to.
func (b *build) add(t *testing.T, apiVersion, kind, name string, data []byte) error {
	t.Helper()
	var obj any
	var put func()
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		o := &appsv1.Deployment{}
		obj, put = o, func() { b.deployments[name] = o }
	case "apps/v1/StatefulSet":
		o := &appsv1.StatefulSet{}
		obj, put = o, func() { b.statefulSets[name] = o }
	case "batch/v1/CronJob":
		o := &batchv1.CronJob{}
		obj, put = o, func() { b.cronJobs[name] = o }
	case "v1/Service":
		o := &corev1.Service{}
		obj, put = o, func() { b.services[name] = o }
	case "v1/ConfigMap":
		o := &corev1.ConfigMap{}
		obj, put = o, func() { b.configMaps[name] = o }
	case "v1/Secret":
		o := &corev1.Secret{}
		obj, put = o, func() { b.secrets[name] = o }
	case "v1/ServiceAccount":
		o := &corev1.ServiceAccount{}
		obj, put = o, func() { b.accounts[name] = o }
	case "networking.k8s.io/v1/NetworkPolicy":
		o := &networkingv1.NetworkPolicy{}
		obj, put = o, func() { b.netPols[name] = o }
	case "policy/v1/PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		obj, put = o, func() { b.pdbs[name] = o }
	case "keda.sh/v1alpha1/ScaledObject":
		o := &scaledObject{}
		obj, put = o, func() { b.scaled[name] = o }
	case "keda.sh/v1alpha1/TriggerAuthentication":
		o := &triggerAuthentication{}
		obj, put = o, func() { b.triggerAuths[name] = o }
	default:
		return fmt.Errorf("unexpected object %s %s/%s", apiVersion, kind, name)
	}
	// Strict: unknown fields, duplicate fields and case-mismatched field
	// names are errors (the apiserver's strict field validation).
	strict, err := sigsjson.UnmarshalStrict(data, obj)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", kind, name, err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("%s/%s: %v", kind, name, strict)
	}
	put()
	return nil
}

// get builds target once per test binary (building is the slow part).
func get(t *testing.T, target string) *build {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := buildCache[target]; ok {
		return b
	}
	dir, err := filepath.Abs(target)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", target, err)
	}
	b := &build{
		target:       target,
		deployments:  map[string]*appsv1.Deployment{},
		statefulSets: map[string]*appsv1.StatefulSet{},
		cronJobs:     map[string]*batchv1.CronJob{},
		services:     map[string]*corev1.Service{},
		configMaps:   map[string]*corev1.ConfigMap{},
		secrets:      map[string]*corev1.Secret{},
		netPols:      map[string]*networkingv1.NetworkPolicy{},
		pdbs:         map[string]*policyv1.PodDisruptionBudget{},
		accounts:     map[string]*corev1.ServiceAccount{},
		scaled:       map[string]*scaledObject{},
		triggerAuths: map[string]*triggerAuthentication{},
	}
	seen := map[string]bool{}
	var raw bytes.Buffer
	for _, r := range rm.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %s: %v", target, r.CurId(), err)
		}
		raw.Write(data)
		raw.WriteByte('\n')
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(data, &tm); err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		id := tm.Kind + "/" + tm.Metadata.Name
		if seen[id] {
			t.Fatalf("%s: %s twice", target, id)
		}
		seen[id] = true
		if err := b.add(t, tm.APIVersion, tm.Kind, tm.Metadata.Name, data); err != nil {
			t.Fatalf("%s: %v", target, err)
		}
	}
	b.raw = raw.Bytes()
	buildCache[target] = b
	return b
}

func forEach(t *testing.T, f func(t *testing.T, b *build)) {
	for _, target := range targets {
		t.Run(strings.ReplaceAll(target, "/", "_"), func(t *testing.T) { f(t, get(t, target)) })
	}
}

// pod is one pod template with where it comes from.
type pod struct {
	kind, name string
	labels     map[string]string
	spec       *corev1.PodSpec
}

func (b *build) pods() []pod {
	var out []pod
	for _, n := range sortedKeys(b.deployments) {
		d := b.deployments[n]
		out = append(out, pod{"Deployment", n, d.Spec.Template.Labels, &d.Spec.Template.Spec})
	}
	for _, n := range sortedKeys(b.statefulSets) {
		s := b.statefulSets[n]
		out = append(out, pod{"StatefulSet", n, s.Spec.Template.Labels, &s.Spec.Template.Spec})
	}
	for _, n := range sortedKeys(b.cronJobs) {
		c := b.cronJobs[n]
		out = append(out, pod{"CronJob", n, c.Spec.JobTemplate.Spec.Template.Labels, &c.Spec.JobTemplate.Spec.Template.Spec})
	}
	return out
}

// ymirflowContainers are the containers that run the ymirflow binary.
func (b *build) ymirflowContainers() []struct {
	pod pod
	c   *corev1.Container
} {
	var out []struct {
		pod pod
		c   *corev1.Container
	}
	for _, p := range b.pods() {
		for i := range p.spec.Containers {
			c := &p.spec.Containers[i]
			if len(c.Command) > 0 && c.Command[0] == "ymirflow" {
				out = append(out, struct {
					pod pod
					c   *corev1.Container
				}{p, c})
			}
		}
	}
	return out
}

func i32(p *int32) string {
	if p == nil {
		return "<unset>"
	}
	return strconv.Itoa(int(*p))
}

func i64(p *int64) string {
	if p == nil {
		return "<unset>"
	}
	return strconv.FormatInt(*p, 10)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func selects(sel *metav1.LabelSelector, lbls map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return false
	}
	return s.Matches(labels.Set(lbls))
}

func envVar(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func TestOverlaysBuildStrictly(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		if len(b.deployments) == 0 || len(b.cronJobs) != 2 || len(b.statefulSets) != 1 {
			t.Errorf("deployments %v, cronjobs %v, statefulsets %v",
				sortedKeys(b.deployments), sortedKeys(b.cronJobs), sortedKeys(b.statefulSets))
		}
		for _, d := range b.deployments {
			if !selects(d.Spec.Selector, d.Spec.Template.Labels) {
				t.Errorf("Deployment %s: selector does not match its pods", d.Name)
			}
		}
		for _, s := range b.statefulSets {
			if !selects(s.Spec.Selector, s.Spec.Template.Labels) {
				t.Errorf("StatefulSet %s: selector does not match its pods", s.Name)
			}
		}
		for _, p := range b.pods() {
			for _, v := range p.spec.Volumes {
				if v.ConfigMap != nil && b.configMaps[v.ConfigMap.Name] == nil {
					t.Errorf("%s %s: volume %s: no ConfigMap %s", p.kind, p.name, v.Name, v.ConfigMap.Name)
				}
			}
			if sa := p.spec.ServiceAccountName; sa != "" && b.accounts[sa] == nil {
				t.Errorf("%s %s: no ServiceAccount %s", p.kind, p.name, sa)
			}
		}
	})
	// The strict decoder really is strict.
	var b build
	b.deployments = map[string]*appsv1.Deployment{}
	bad := []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"replica":2}}`)
	if err := b.add(t, "apps/v1", "Deployment", "x", bad); err == nil {
		t.Error("unknown field spec.replica accepted")
	}
	bad = []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"Replicas":2}}`)
	if err := b.add(t, "apps/v1", "Deployment", "x", bad); err == nil {
		t.Error("case-mismatched field spec.Replicas accepted")
	}
}

func TestWorkerDeployments(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		want := map[string]bool{}
		for _, w := range workers {
			want[w.name] = true
			d := b.deployments[w.name]
			if d == nil {
				t.Errorf("no Deployment %s", w.name)
				continue
			}
			checkWorkerDeployment(t, b, w, d)
		}
		for name, d := range b.deployments {
			if d.Spec.Template.Labels["app.kubernetes.io/component"] == "worker" && !want[name] {
				t.Errorf("unexpected worker Deployment %s", name)
			}
		}
	})
}

// checkWorkerDeployment checks worker w's Deployment d: replicas, rolling update,
// grace period, pod labels, and its one container.
func checkWorkerDeployment(t *testing.T, b *build, w workerSpec, d *appsv1.Deployment) {
	t.Helper()
	replicas := w.replicas
	if b.target == "overlays/dev" {
		replicas = 1
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != replicas {
		t.Errorf("%s: replicas %s, want %d", w.name, i32(d.Spec.Replicas), replicas)
	}
	st := d.Spec.Strategy
	if st.Type != appsv1.RollingUpdateDeploymentStrategyType || st.RollingUpdate == nil ||
		st.RollingUpdate.MaxSurge == nil || st.RollingUpdate.MaxSurge.String() != "1" ||
		st.RollingUpdate.MaxUnavailable == nil || st.RollingUpdate.MaxUnavailable.String() != "0" {
		t.Errorf("%s: strategy %+v, want RollingUpdate maxSurge 1 maxUnavailable 0", w.name, st)
	}
	spec := d.Spec.Template.Spec
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds != graceSeconds {
		t.Errorf("%s: terminationGracePeriodSeconds %s, want %d", w.name, i64(spec.TerminationGracePeriodSeconds), graceSeconds)
	}
	lb := d.Spec.Template.Labels
	if lb["ymirflow.io/agent"] != w.agent || lb["ymirflow.io/branch"] != w.branch || lb["app.kubernetes.io/component"] != "worker" {
		t.Errorf("%s: pod labels %v", w.name, lb)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", w.name, len(spec.Containers))
	}
	checkWorkerContainer(t, b, w, &spec.Containers[0])
}

// checkWorkerContainer checks worker w's container c: its command, its probes on the
// metrics port, CONSUMER_NAME from the pod's name, and a small memory limit in dev.
func checkWorkerContainer(t *testing.T, b *build, w workerSpec, c *corev1.Container) {
	t.Helper()
	args := []string{"worker", "--agent", w.agent}
	if w.branch != "" {
		args = append(args, "--branch", w.branch)
	}
	if !slices.Equal(c.Command, []string{"ymirflow"}) || !slices.Equal(c.Args, args) {
		t.Errorf("%s: runs %v %v, want [ymirflow] %v", w.name, c.Command, c.Args, args)
	}
	// Probes on the metrics port.
	port := -1
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = int(p.ContainerPort)
		}
	}
	if port < 0 {
		t.Errorf("%s: no port named metrics", w.name)
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", w.name, pr.name)
			continue
		}
		g := pr.probe.HTTPGet
		if g.Path != pr.path || (g.Port.String() != "metrics" && g.Port.IntValue() != port) {
			t.Errorf("%s: %s probe %s on %s, want %s on the metrics port", w.name, pr.name, g.Path, g.Port.String(), pr.path)
		}
	}
	// CONSUMER_NAME is the pod's name: stable across a container
	// restart, unique per pod.
	if e := envVar(c, "CONSUMER_NAME"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil ||
		e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("%s: CONSUMER_NAME is not the pod name (fieldRef metadata.name): %+v", w.name, e)
	}
	if b.target == "overlays/dev" {
		if lim := c.Resources.Limits[corev1.ResourceMemory]; lim.Cmp(resource.MustParse("256Mi")) > 0 {
			t.Errorf("%s: dev memory limit %s is not small", w.name, lim.String())
		}
	}
}

func TestPodHardening(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		for _, p := range b.pods() {
			where := p.kind + " " + p.name
			sc := p.spec.SecurityContext
			if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Errorf("%s: pod not runAsNonRoot", where)
			}
			if sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				t.Errorf("%s: runAsUser 0", where)
			}
			if p.spec.AutomountServiceAccountToken == nil || *p.spec.AutomountServiceAccountToken {
				t.Errorf("%s: service account token mounted", where)
			}
			// Service links would add variables (VALKEY_PORT, ...) that no
			// command reads.
			if p.spec.EnableServiceLinks == nil || *p.spec.EnableServiceLinks {
				t.Errorf("%s: enableServiceLinks not false", where)
			}
			for _, c := range p.spec.Containers {
				where := where + " container " + c.Name
				cs := c.SecurityContext
				if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
					t.Errorf("%s: root filesystem not read-only", where)
				}
				if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
					t.Errorf("%s: privilege escalation allowed", where)
				}
				if cs == nil || cs.Capabilities == nil || !slices.Contains(cs.Capabilities.Drop, "ALL") {
					t.Errorf("%s: capabilities not dropped", where)
				}
				for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					req, okReq := c.Resources.Requests[r]
					lim, okLim := c.Resources.Limits[r]
					if !okReq || !okLim {
						t.Errorf("%s: %s request or limit missing", where, r)
					} else if req.Cmp(lim) > 0 {
						t.Errorf("%s: %s request %s above limit %s", where, r, req.String(), lim.String())
					}
				}
				if b.target != "base" && (!strings.Contains(c.Image, ":") || strings.HasSuffix(c.Image, ":latest")) {
					t.Errorf("%s: image %q has no pinned tag", where, c.Image)
				}
			}
		}
	})
}

func TestPodDisruptionBudgets(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		for _, w := range workers {
			d := b.deployments[w.name]
			if d == nil {
				continue
			}
			var found []string
			for name, pdb := range b.pdbs {
				if selects(pdb.Spec.Selector, d.Spec.Template.Labels) {
					found = append(found, name)
					// Drains must be possible even with one replica, and no
					// more than one pod of an agent goes at a time.
					if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" {
						t.Errorf("PDB %s: want maxUnavailable 1 and no minAvailable, got %+v", name, pdb.Spec)
					}
					for other, od := range b.deployments {
						if other != w.name && selects(pdb.Spec.Selector, od.Spec.Template.Labels) {
							t.Errorf("PDB %s also selects Deployment %s", name, other)
						}
					}
				}
			}
			if len(found) != 1 {
				t.Errorf("Deployment %s: %d PodDisruptionBudgets %v, want 1", w.name, len(found), found)
			}
		}
	})
}

func TestFetcherCronJobs(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		for _, want := range []struct {
			name, schedule string
			active         int64
		}{
			{"ymirflow-fetch-daily", "0 8 * * *", 600},
			// The webhook receiver takes ymir_todo within a second; this sweep is its
			// safety net, so it runs less often than before the receiver (every 5 minutes).
			{"ymirflow-fetch-todo", "*/30 * * * *", 240},
		} {
			cj := b.cronJobs[want.name]
			if cj == nil {
				t.Errorf("no CronJob %s", want.name)
				continue
			}
			s := cj.Spec
			if s.Schedule != want.schedule || s.TimeZone == nil || *s.TimeZone != "Etc/UTC" {
				tz := "<unset>"
				if s.TimeZone != nil {
					tz = *s.TimeZone
				}
				t.Errorf("%s: schedule %q time zone %s, want %q Etc/UTC", want.name, s.Schedule, tz, want.schedule)
			}
			if s.ConcurrencyPolicy != batchv1.ForbidConcurrent {
				t.Errorf("%s: concurrencyPolicy %q, want Forbid", want.name, s.ConcurrencyPolicy)
			}
			if s.StartingDeadlineSeconds == nil || *s.StartingDeadlineSeconds <= 0 {
				t.Errorf("%s: no startingDeadlineSeconds", want.name)
			}
			js := s.JobTemplate.Spec
			if js.ActiveDeadlineSeconds == nil || *js.ActiveDeadlineSeconds != want.active {
				t.Errorf("%s: activeDeadlineSeconds %s, want %d", want.name, i64(js.ActiveDeadlineSeconds), want.active)
			}
			if js.BackoffLimit == nil || *js.BackoffLimit != 2 {
				t.Errorf("%s: backoffLimit %s, want 2", want.name, i32(js.BackoffLimit))
			}
			if s.SuccessfulJobsHistoryLimit == nil || s.FailedJobsHistoryLimit == nil {
				t.Errorf("%s: job history limits unset", want.name)
			}
			ps := js.Template.Spec
			if ps.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("%s: restartPolicy %q", want.name, ps.RestartPolicy)
			}
			if len(ps.Containers) != 1 || !slices.Equal(ps.Containers[0].Args, []string{"fetch", "--once"}) {
				t.Errorf("%s: containers %+v, want one running fetch --once", want.name, ps.Containers)
				continue
			}
			env := resolveEnv(t, b, &ps.Containers[0], ps, "pod")
			jql := env["JIRA_JQL"]
			switch {
			case jql == "":
				t.Errorf("%s: no JIRA_JQL", want.name)
			case want.name == "ymirflow-fetch-daily" && b.target == "base" && jql != config.DefaultJQL:
				t.Errorf("%s: JIRA_JQL %q, want the default %q", want.name, jql, config.DefaultJQL)
			case want.name == "ymirflow-fetch-todo" && !strings.Contains(jql, "ymir_todo"):
				t.Errorf("%s: JIRA_JQL %q does not select ymir_todo", want.name, jql)
			}
		}
	})
}

// valkeyConf parses "key value..." lines.
func valkeyConf(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		out[strings.ToLower(k)] = strings.TrimSpace(v)
	}
	return out
}

// parseMem reads a Redis memory size such as 512mb or 1gb.
func parseMem(s string) (int64, error) {
	s = strings.ToLower(s)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"k", 1000}, {"m", 1000 * 1000}, {"g", 1000 * 1000 * 1000}} {
		if strings.HasSuffix(s, u.suffix) {
			n, err := strconv.ParseInt(strings.TrimSuffix(s, u.suffix), 10, 64)
			return n * u.mult, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

func TestValkey(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		ss := b.statefulSets["valkey"]
		if ss == nil {
			t.Fatal("no StatefulSet valkey")
		}
		c, mounts := valkeyContainer(t, ss)
		kv := valkeyConfig(t, b, ss, c, mounts)
		aclRef := valkeyACLSecret(t, ss, mounts, kv["aclfile"])
		sec, users := valkeyServiceAndUsers(t, b, ss, aclRef)
		checkRedisURLs(t, b, aclRef, sec, users)
		checkValkeyProbe(t, c, aclRef, sec, users)
	})
}

// valkeyContainer checks the StatefulSet's one replica, its PVC mounted at /data and its
// one container; it returns the container and its mounts (volume name → path).
func valkeyContainer(t *testing.T, ss *appsv1.StatefulSet) (*corev1.Container, map[string]string) {
	t.Helper()
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 1 {
		t.Errorf("replicas %s, want 1", i32(ss.Spec.Replicas))
	}
	if len(ss.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("%d volumeClaimTemplates, want 1", len(ss.Spec.VolumeClaimTemplates))
	}
	pvc := ss.Spec.VolumeClaimTemplates[0]
	if st := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; st.IsZero() {
		t.Error("PVC without a storage request")
	}
	spec := ss.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := &spec.Containers[0]
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts[pvc.Name] != "/data" {
		t.Errorf("PVC %s mounted at %q, want /data", pvc.Name, mounts[pvc.Name])
	}
	return c, mounts
}

// valkeyConfig finds the config file (from a mounted ConfigMap, named in the args) and
// checks its durability and memory settings, and that no password is in it or on the
// command line. It returns the file's settings.
func valkeyConfig(t *testing.T, b *build, ss *appsv1.StatefulSet, c *corev1.Container, mounts map[string]string) map[string]string {
	t.Helper()
	// The config file: from a mounted ConfigMap, named in the args.
	var conf string
	for _, v := range ss.Spec.Template.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		cm := b.configMaps[v.ConfigMap.Name]
		if cm == nil {
			t.Fatalf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
		}
		for key, text := range cm.Data {
			if len(c.Args) > 0 && c.Args[0] == filepath.Join(mounts[v.Name], key) {
				conf = text
			}
		}
	}
	if conf == "" {
		t.Fatalf("valkey args %v do not name a mounted config file", c.Args)
	}
	kv := valkeyConf(conf)
	for k, want := range map[string]string{
		"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction", "dir": "/data",
	} {
		if kv[k] != want {
			t.Errorf("valkey.conf %s = %q, want %q", k, kv[k], want)
		}
	}
	if _, ok := kv["requirepass"]; ok {
		t.Error("valkey.conf holds a password; it belongs in the Secret")
	}
	maxmem, err := parseMem(kv["maxmemory"])
	limit := c.Resources.Limits[corev1.ResourceMemory]
	if err != nil || maxmem <= 0 {
		t.Errorf("valkey.conf maxmemory %q: want a size", kv["maxmemory"])
	} else if 2*maxmem > limit.Value() {
		t.Errorf("maxmemory %s is more than half the memory limit %s (AOF rewrites fork)", kv["maxmemory"], limit.String())
	}

	// No password on a command line (ps and /proc show it to the whole node): the
	// users and their passwords are in the aclfile, a file of a Secret.
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		if strings.Contains(strings.ToLower(a), "pass") || strings.Contains(a, "$(") {
			t.Errorf("valkey command line %v carries a password", append(c.Command, c.Args...))
		}
	}
	return kv
}

// valkeyACLSecret returns the Secret volume whose users.acl is mounted at aclPath (the
// config's aclfile).
func valkeyACLSecret(t *testing.T, ss *appsv1.StatefulSet, mounts map[string]string, aclPath string) *corev1.SecretVolumeSource {
	t.Helper()
	var aclRef *corev1.SecretVolumeSource
	for _, v := range ss.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if aclPath != "" && aclPath == filepath.Join(mounts[v.Name], it.Path) && it.Key == "users.acl" {
				aclRef = v.Secret
			}
		}
	}
	if aclRef == nil {
		t.Fatalf("valkey.conf aclfile %q is not the users.acl of a mounted Secret", aclPath)
	}
	return aclRef
}

// valkeyServiceAndUsers checks the Service valkey, and returns the ACL Secret and its
// users when the build has it (prod: created in the cluster), the default user off.
func valkeyServiceAndUsers(t *testing.T, b *build, ss *appsv1.StatefulSet, aclRef *corev1.SecretVolumeSource) (*corev1.Secret, map[string]aclUser) {
	t.Helper()
	// The Service and the ymirflow pods' REDIS_URL: a user of the aclfile.
	svc := b.services["valkey"]
	if svc == nil || !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, ss.Spec.Template.Labels) {
		t.Fatal("no Service valkey selecting the valkey pods")
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 6379 {
		t.Errorf("Service valkey ports %+v", svc.Spec.Ports)
	}
	sec := b.secrets[aclRef.SecretName]
	var users map[string]aclUser
	if sec != nil { // prod: created in the cluster
		users = parseACL(t, secretValue(sec, "users.acl"))
		if d, ok := users["default"]; !ok || d.on {
			t.Error("users.acl leaves the default user on: every client must name itself")
		}
	}
	return sec, users
}

// checkRedisURLs: every ymirflow pod's REDIS_URL comes from the ACL Secret and names an
// enabled, least-privileged user of users.acl with its password, at valkey:6379.
func checkRedisURLs(t *testing.T, b *build, aclRef *corev1.SecretVolumeSource, sec *corev1.Secret, users map[string]aclUser) {
	t.Helper()
	for _, yc := range b.ymirflowContainers() {
		if yc.c.Args[0] == "fakejira" {
			continue
		}
		e := envVar(yc.c, "REDIS_URL")
		if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != aclRef.SecretName {
			t.Errorf("%s %s: REDIS_URL not from Secret %s: %+v", yc.pod.kind, yc.pod.name, aclRef.SecretName, e)
			continue
		}
		if sec == nil {
			continue
		}
		u, err := url.Parse(secretValue(sec, e.ValueFrom.SecretKeyRef.Key))
		if err != nil {
			t.Fatalf("REDIS_URL in Secret %s: %v", sec.Name, err)
		}
		if u.Hostname() != "valkey" || u.Port() != "6379" {
			t.Errorf("Secret %s: REDIS_URL host %s, want valkey:6379", sec.Name, u.Host)
		}
		pw, _ := u.User.Password()
		usr, ok := users[u.User.Username()]
		switch {
		case !ok || !usr.on:
			t.Errorf("%s %s: REDIS_URL user %q is not an enabled user of users.acl", yc.pod.kind, yc.pod.name, u.User.Username())
		case usr.password != pw:
			t.Errorf("%s %s: REDIS_URL password differs from users.acl's for %s", yc.pod.kind, yc.pod.name, usr.name)
		case !usr.leastPrivilege():
			t.Errorf("user %s: rules %v are not least privilege (-@all first, no +@all, no ~* or allkeys)", usr.name, usr.rules)
		}
	}
}

// checkValkeyProbe: the readiness probe authenticates as a user of the aclfile, its
// password from the same Secret, through the environment.
func checkValkeyProbe(t *testing.T, c *corev1.Container, aclRef *corev1.SecretVolumeSource, sec *corev1.Secret, users map[string]aclUser) {
	t.Helper()
	probe := c.ReadinessProbe
	if probe == nil || probe.Exec == nil {
		t.Fatal("valkey has no exec readiness probe")
	}
	cmd := probe.Exec.Command
	i := slices.Index(cmd, "--user")
	auth := envVar(c, "REDISCLI_AUTH")
	if i < 0 || i+1 >= len(cmd) || auth == nil || auth.ValueFrom == nil || auth.ValueFrom.SecretKeyRef == nil ||
		auth.ValueFrom.SecretKeyRef.Name != aclRef.SecretName {
		t.Fatalf("readiness probe %v / REDISCLI_AUTH %+v: want --user NAME and the password from Secret %s", cmd, auth, aclRef.SecretName)
	}
	if sec != nil && users[cmd[i+1]].password != secretValue(sec, auth.ValueFrom.SecretKeyRef.Key) {
		t.Errorf("readiness probe: REDISCLI_AUTH is not %s's password", cmd[i+1])
	}
}

// aclUser is one "user NAME rule..." line of an ACL file.
type aclUser struct {
	name     string
	on       bool
	password string
	rules    []string
}

func (u aclUser) leastPrivilege() bool {
	minus := slices.Index(u.rules, "-@all")
	if minus < 0 {
		return false
	}
	for i, r := range u.rules {
		if r == "+@all" || r == "allcommands" || r == "~*" || r == "allkeys" || (r == "nocommands" && i > minus) {
			return false
		}
	}
	return true
}

func parseACL(t *testing.T, text string) map[string]aclUser {
	t.Helper()
	out := map[string]aclUser{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[0] != "user" || len(f) < 2 {
			t.Fatalf("users.acl line %q is not a user line", line)
		}
		u := aclUser{name: f[1], rules: f[2:]}
		for _, r := range f[2:] {
			switch {
			case r == "on":
				u.on = true
			case r == "off":
				u.on = false
			case strings.HasPrefix(r, ">"):
				u.password = r[1:]
			}
		}
		out[u.name] = u
	}
	return out
}

// The workers' metrics port answers only the monitoring stack, and nothing else
// reaches the workers.
func TestWorkerMetricsNetworkPolicy(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		for _, p := range b.pods() {
			if p.kind != "Deployment" || !strings.HasPrefix(p.name, "ymirflow-") || p.labels["app.kubernetes.io/component"] != "worker" {
				continue
			}
			var pols []*networkingv1.NetworkPolicy
			for _, np := range b.netPols {
				if selects(&np.Spec.PodSelector, p.labels) && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
					pols = append(pols, np)
				}
			}
			if len(pols) == 0 {
				t.Errorf("%s: no ingress NetworkPolicy selects its pods", p.name)
				continue
			}
			for _, np := range pols {
				for _, rule := range np.Spec.Ingress {
					if len(rule.From) == 0 {
						t.Errorf("%s: NetworkPolicy %s lets anyone in", p.name, np.Name)
					}
					for _, peer := range rule.From {
						if peer.IPBlock != nil || (peer.PodSelector == nil && peer.NamespaceSelector == nil) ||
							(peer.PodSelector != nil && len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0) {
							t.Errorf("%s: NetworkPolicy %s peer %+v is not a specific selector", p.name, np.Name, peer)
						}
					}
					if len(rule.Ports) == 0 {
						t.Errorf("%s: NetworkPolicy %s opens every port", p.name, np.Name)
					}
					for _, port := range rule.Ports {
						if port.Port == nil || (port.Port.IntValue() != 9090 && port.Port.String() != "metrics") {
							t.Errorf("%s: NetworkPolicy %s opens port %v, want only the metrics port", p.name, np.Name, port.Port)
						}
					}
				}
			}
		}
	})
}

func secretValue(s *corev1.Secret, key string) string {
	if v, ok := s.StringData[key]; ok {
		return v
	}
	return string(s.Data[key])
}

func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		ss := b.statefulSets["valkey"]
		var pols []*networkingv1.NetworkPolicy
		for _, np := range b.netPols {
			if selects(&np.Spec.PodSelector, ss.Spec.Template.Labels) {
				pols = append(pols, np)
			}
		}
		if len(pols) != 1 {
			t.Fatalf("%d NetworkPolicies select the valkey pods, want 1", len(pols))
		}
		np := pols[0]
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("policyTypes %v lack Ingress", np.Spec.PolicyTypes)
		}
		if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) == 0 {
			t.Fatalf("ingress %+v: want one rule with sources", np.Spec.Ingress)
		}
		rule := np.Spec.Ingress[0]
		for _, peer := range rule.From {
			if peer.IPBlock != nil || peer.NamespaceSelector != nil || peer.PodSelector == nil {
				t.Errorf("peer %+v: only pod selectors in the namespace may reach Valkey", peer)
			}
		}
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.IntValue() != 6379 {
			t.Errorf("ports %+v, want 6379 only", rule.Ports)
		}
		allowed := func(lbls map[string]string) bool {
			for _, peer := range rule.From {
				if peer.PodSelector != nil && selects(peer.PodSelector, lbls) {
					return true
				}
			}
			return false
		}
		for _, p := range b.pods() {
			needsRedis := false
			for _, c := range p.spec.Containers {
				needsRedis = needsRedis || envVar(&c, "REDIS_URL") != nil
			}
			if needsRedis != allowed(p.labels) {
				t.Errorf("%s %s: uses Redis %v, allowed to reach Valkey %v", p.kind, p.name, needsRedis, allowed(p.labels))
			}
		}
	})
}

// resolveEnv returns the environment a container gets, as the kubelet builds
// it: envFrom (ConfigMaps, Secrets), then env. Values that only exist in a
// cluster get stand-ins: fieldRef metadata.name is podName, a Secret that the
// build lacks (prod) gets a sample value.
func resolveEnv(t *testing.T, b *build, c *corev1.Container, spec corev1.PodSpec, podName string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm := b.configMaps[ef.ConfigMapRef.Name]
			if cm == nil {
				t.Fatalf("%s: envFrom ConfigMap %s not in the build", c.Name, ef.ConfigMapRef.Name)
			}
			for k, v := range cm.Data {
				env[ef.Prefix+k] = v
			}
		case ef.SecretRef != nil:
			s := b.secrets[ef.SecretRef.Name]
			if s == nil {
				t.Fatalf("%s: envFrom Secret %s not in the build; use secretKeyRef", c.Name, ef.SecretRef.Name)
			}
			for k := range s.Data {
				env[ef.Prefix+k] = secretValue(s, k)
			}
			for k := range s.StringData {
				env[ef.Prefix+k] = secretValue(s, k)
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := b.configMaps[ref.Name]
			if cm == nil {
				t.Fatalf("%s: %s from ConfigMap %s, not in the build", c.Name, e.Name, ref.Name)
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				t.Fatalf("%s: %s from ConfigMap %s key %s, which it lacks", c.Name, e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if s := b.secrets[ref.Name]; s != nil {
				env[e.Name] = secretValue(s, ref.Key)
				continue
			}
			keys, ok := prodSecrets[ref.Name]
			if !ok || !slices.Contains(keys, ref.Key) {
				t.Fatalf("%s: %s from Secret %s key %s, which is neither in the build nor documented", c.Name, e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = map[string]string{"redis-url": "redis://:sample@valkey:6379/0"}[ref.Key]
		default:
			t.Fatalf("%s: %s: unexpected valueFrom %+v", c.Name, e.Name, e.ValueFrom)
		}
	}
	return env
}

// TestEnvironmentIsTheBinarys holds every variable the manifests give a
// ymirflow container (env and envFrom) to the settings of the command it runs,
// as the binary itself lists them.
func TestEnvironmentIsTheBinarys(t *testing.T) {
	t.Parallel()
	known := config.EnvNames()
	forEach(t, func(t *testing.T, b *build) {
		cs := b.ymirflowContainers()
		if len(cs) < len(workers)+2 {
			t.Fatalf("only %d ymirflow containers", len(cs))
		}
		for _, yc := range cs {
			where := yc.pod.kind + " " + yc.pod.name
			if len(yc.c.Args) == 0 {
				t.Errorf("%s: no command", where)
				continue
			}
			cmd := yc.c.Args[0]
			reads := config.EnvNamesOf(cmd)
			if reads == nil {
				t.Errorf("%s: runs %q, not a ymirflow command", where, cmd)
				continue
			}
			env := resolveEnv(t, b, yc.c, *yc.pod.spec, yc.pod.name)
			for _, name := range sortedKeys(env) {
				if len(known[name]) == 0 {
					t.Errorf("%s: sets %s, which ymirflow does not read", where, name)
				} else if !slices.Contains(reads, name) {
					t.Errorf("%s: sets %s, which `ymirflow %s` does not read (only %v do)", where, name, cmd, known[name])
				}
			}
		}
	})
}

// TestSettingsValidate runs each ymirflow container's environment and
// arguments through the command's own parsing and validation, and checks the
// worker's shutdown budget against the pod's grace period.
func TestSettingsValidate(t *testing.T) {
	// Not parallel: its subtests set the process environment (t.Setenv), which Go refuses in a parallel test.
	for _, target := range targets {
		b := get(t, target)
		for _, yc := range b.ymirflowContainers() {
			t.Run(strings.ReplaceAll(target, "/", "_")+"/"+yc.pod.name, func(t *testing.T) {
				for name := range config.EnvNames() {
					t.Setenv(name, "") // empty is unset: nothing leaks from the test's environment
				}
				env := resolveEnv(t, b, yc.c, *yc.pod.spec, yc.pod.name+"-5d9c7b6f4-x2x7q")
				// Files from mounted Secrets do not exist here: stand in a temp file.
				for name, v := range env {
					if mounted, ok := secretMount(yc.c, *yc.pod.spec, v); ok {
						f := filepath.Join(t.TempDir(), filepath.Base(mounted))
						if err := os.WriteFile(f, []byte("sample-token\n"), 0o600); err != nil {
							t.Fatal(err)
						}
						env[name] = f
					}
				}
				for k, v := range env {
					t.Setenv(k, v)
				}
				cmd := yc.c.Args[0]
				settings := config.Commands()[cmd]
				if settings == nil {
					t.Fatalf("unknown command %q", cmd)
				}
				if _, err := config.Load(cmd, settings, yc.c.Args[1:]); err != nil {
					t.Fatalf("`ymirflow %s` refuses these settings: %v", strings.Join(yc.c.Args, " "), err)
				}
				w, ok := settings.(*config.Worker)
				if !ok {
					return
				}
				grace := time.Duration(*yc.pod.spec.TerminationGracePeriodSeconds) * time.Second
				if budget := w.ShutdownBudget(); grace <= budget {
					t.Errorf("terminationGracePeriodSeconds %v does not exceed BLOCK_TIME %v + 1s + KILL_GRACE %v = %v",
						grace, w.BlockTime, w.KillGrace, budget)
				}
				_, port, err := net.SplitHostPort(w.MetricsAddr)
				if err != nil {
					t.Fatalf("METRICS_ADDR %q", w.MetricsAddr)
				}
				found := false
				for _, p := range yc.c.Ports {
					found = found || (p.Name == "metrics" && strconv.Itoa(int(p.ContainerPort)) == port)
				}
				if !found {
					t.Errorf("METRICS_ADDR %q: no container port named metrics on %s", w.MetricsAddr, port)
				}
				// The exec runner needs /bin/sh and the agent program, which
				// the fetchers' distroless image lacks.
				for _, cj := range b.cronJobs {
					if img := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Image; w.Runner == "exec" && img == yc.c.Image {
						t.Errorf("RUNNER=exec in image %s, the fetchers' distroless image (no /bin/sh, no agent)", img)
					}
				}
			})
		}
	}
}

// secretMount reports whether path is a file inside a Secret volume mounted
// in c.
func secretMount(c *corev1.Container, spec corev1.PodSpec, path string) (string, bool) {
	if !strings.HasPrefix(path, "/") {
		return "", false
	}
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return path, true
			}
		}
	}
	return "", false
}

func TestJiraTokenFromSecret(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		for _, yc := range b.ymirflowContainers() {
			if !slices.Contains(config.EnvNamesOf(yc.c.Args[0]), "JIRA_TOKEN_FILE") {
				continue // fakejira, the console: no Jira client
			}
			where := yc.pod.kind + " " + yc.pod.name
			if envVar(yc.c, "JIRA_TOKEN") != nil {
				t.Errorf("%s: JIRA_TOKEN in the environment; mount the Secret and set JIRA_TOKEN_FILE", where)
			}
			e := envVar(yc.c, "JIRA_TOKEN_FILE")
			if e == nil {
				t.Errorf("%s: no JIRA_TOKEN_FILE", where)
				continue
			}
			if _, ok := secretMount(yc.c, *yc.pod.spec, e.Value); !ok {
				t.Errorf("%s: JIRA_TOKEN_FILE %s is not in a mounted Secret", where, e.Value)
			}
			for _, v := range yc.pod.spec.Volumes {
				if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o022 != 0) {
					t.Errorf("%s: Secret volume %s writable by group or others", where, v.Name)
				}
			}
		}
	})
}

func TestProdShipsNoPlaceholderSecrets(t *testing.T) {
	t.Parallel()
	b := get(t, "overlays/prod")
	if len(b.secrets) != 0 {
		t.Errorf("prod ships Secrets %v; they must be created in the cluster", sortedKeys(b.secrets))
	}
	if bytes.Contains(b.raw, []byte("change-me")) {
		t.Error("prod output contains the placeholder change-me")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, keys := range prodSecrets {
		for _, k := range append([]string{name}, keys...) {
			if !bytes.Contains(readme, []byte(k)) {
				t.Errorf("README.md does not mention %s (Secret %s)", k, name)
			}
		}
	}
	// Every Secret that a prod pod refers to is documented.
	for _, p := range b.pods() {
		for _, c := range p.spec.Containers {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					if keys := prodSecrets[e.ValueFrom.SecretKeyRef.Name]; !slices.Contains(keys, e.ValueFrom.SecretKeyRef.Key) {
						t.Errorf("%s %s: Secret %s key %s undocumented", p.kind, p.name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
					}
				}
			}
		}
		for _, v := range p.spec.Volumes {
			if v.Secret != nil {
				if _, ok := prodSecrets[v.Secret.SecretName]; !ok {
					t.Errorf("%s %s: Secret %s undocumented", p.kind, p.name, v.Secret.SecretName)
				}
			}
		}
	}
}

func TestContainerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{
		"CGO_ENABLED=0",
		`-X main.version=${VERSION}`,
		"gcr.io/distroless/static",
		":nonroot",
		"USER 65532:65532",
		`ENTRYPOINT ["/usr/local/bin/ymirflow"]`,
		"./cmd/ymirflow",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Containerfile lacks %q", want)
		}
	}
	// The last stage is the default target: it must be the distroless one.
	froms := stages(text)
	if len(froms) < 2 || !strings.Contains(froms[len(froms)-1], "gcr.io/distroless/static") {
		t.Errorf("stages %v: the last (default) stage must be distroless static", froms)
	}
}

// stages returns the image of each FROM line, with ARG defaults substituted.
func stages(text string) []string {
	args := map[string]string{}
	var out []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "ARG":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				args[k] = v
			}
		case len(f) >= 2 && f[0] == "FROM":
			out = append(out, os.Expand(f[1], func(k string) string { return args[k] }))
		}
	}
	return out
}

// TestConsole: the operator console is read-only as deployed (no token can be read, and
// WEB_READ_ONLY says so), uses the operators' Valkey user, and only pods of the namespace
// reach it, on its port alone.
func TestConsole(t *testing.T) {
	// Not parallel: its checks resolve the container's settings with t.Setenv, which Go refuses
	// in a parallel test.
	forEach(t, func(t *testing.T, b *build) {
		d := b.deployments["ymirflow-console"]
		if d == nil {
			t.Fatal("no ymirflow-console Deployment")
		}
		c := &d.Spec.Template.Spec.Containers[0]
		if len(c.Args) == 0 || c.Args[0] != "web" {
			t.Fatalf("console runs %v, want web", c.Args)
		}
		env := resolveEnv(t, b, c, d.Spec.Template.Spec, d.Name)
		for k, v := range env {
			t.Setenv(k, v)
		}
		t.Setenv("WEB_TOKEN", "")
		t.Setenv("WEB_TOKEN_FILE", "")
		var w config.Web
		if _, err := config.Load("web", &w, nil); err != nil {
			t.Fatalf("the console's settings: %v", err)
		}
		if tok, err := w.WriteToken(); err != nil || tok != "" || !w.ReadOnly {
			t.Errorf("the console is not read-only as deployed (read-only %v, token set %v, %v)", w.ReadOnly, tok != "", err)
		}
		if r := envVar(c, "REDIS_URL"); r == nil || r.ValueFrom == nil || r.ValueFrom.SecretKeyRef == nil || r.ValueFrom.SecretKeyRef.Key != "operator-url" {
			t.Errorf("REDIS_URL %+v: want the operators' user (operator-url)", r)
		}
		_, port, _ := net.SplitHostPort(w.Addr)
		svc := b.services["ymirflow-console"]
		if svc == nil || !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, d.Spec.Template.Labels) ||
			len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "http" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Fatalf("Service ymirflow-console %+v does not serve the console's pods inside the cluster", svc)
		}
		checkConsoleIngress(t, b, d, port)
	})
}

// checkConsoleIngress: ingress NetworkPolicies select the console's pods (d) and let in
// only pods of the namespace, on the console's port only.
func checkConsoleIngress(t *testing.T, b *build, d *appsv1.Deployment, port string) {
	t.Helper()
	var pols []*networkingv1.NetworkPolicy
	for _, np := range b.netPols {
		if selects(&np.Spec.PodSelector, d.Spec.Template.Labels) && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			pols = append(pols, np)
		}
	}
	if len(pols) == 0 {
		t.Fatal("no ingress NetworkPolicy selects the console's pods")
	}
	for _, np := range pols {
		for _, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("NetworkPolicy %s lets anyone reach the console", np.Name)
			}
			for _, peer := range rule.From {
				if peer.IPBlock != nil || peer.NamespaceSelector != nil || peer.PodSelector == nil {
					t.Errorf("NetworkPolicy %s peer %+v reaches beyond the namespace", np.Name, peer)
				}
			}
			for _, p := range rule.Ports {
				if p.Port == nil || (p.Port.String() != port && p.Port.String() != "http") {
					t.Errorf("NetworkPolicy %s opens port %v, want only %s", np.Name, p.Port, port)
				}
			}
			if len(rule.Ports) == 0 {
				t.Errorf("NetworkPolicy %s opens every port", np.Name)
			}
		}
	}
}

// The cluster overlay is prod without the in-namespace Valkey: every workload still
// reads REDIS_URL from the Secret ymirflow-redis (whose URL names the cluster's masters),
// and README.md says how to write that URL.
func TestClusterOverlayDropsValkey(t *testing.T) {
	t.Parallel()
	b := get(t, "overlays/cluster")
	prod := get(t, "overlays/prod")
	if len(b.statefulSets) != 0 || b.services["valkey"] != nil || b.services["valkey-headless"] != nil || b.netPols["valkey"] != nil {
		t.Errorf("the cluster overlay still ships Valkey: statefulsets %v, services %v, network policies %v",
			sortedKeys(b.statefulSets), sortedKeys(b.services), sortedKeys(b.netPols))
	}
	if len(b.deployments) != len(prod.deployments) || len(b.cronJobs) != len(prod.cronJobs) || len(b.secrets) != 0 {
		t.Errorf("cluster overlay: %d deployments, %d cron jobs, %d secrets; prod has %d, %d, 0",
			len(b.deployments), len(b.cronJobs), len(b.secrets), len(prod.deployments), len(prod.cronJobs))
	}
	for _, p := range b.pods() {
		for _, c := range p.spec.Containers {
			for _, e := range c.Env {
				if e.Name == "REDIS_URL" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "ymirflow-redis") {
					t.Errorf("%s %s: REDIS_URL not from the Secret ymirflow-redis", p.kind, p.name)
				}
			}
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte("overlays/cluster")) || !bytes.Contains(readme, []byte("@redis-0:6379,redis-1:6379,redis-2:6379/0")) {
		t.Error("README.md does not say how to deploy on a Redis Cluster (overlays/cluster, a redis-url naming every master)")
	}
}
