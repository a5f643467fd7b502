package deploy

import (
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The webhook receiver (issue 17): a Deployment of 2 replicas (1 in dev) running
// `ymirflow webhook` with its secret from a Secret file, a Service on its port, a
// NetworkPolicy admitting ingress on that port, and an Ingress left for the operator.
func TestWebhookReceiver(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b *build) {
		d := b.deployments["ymirflow-webhook"]
		if d == nil {
			t.Fatal("no Deployment ymirflow-webhook")
		}
		want := int32(2)
		if b.target == "overlays/dev" {
			want = 1
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != want {
			t.Errorf("replicas %s, want %d", i32(d.Spec.Replicas), want)
		}
		spec := d.Spec.Template.Spec
		if len(spec.Containers) != 1 || !slices.Equal(spec.Containers[0].Args, []string{"webhook"}) {
			t.Fatalf("containers %+v, want one running webhook", spec.Containers)
		}
		port := checkWebhookContainer(t, b, &spec.Containers[0], spec)
		svc := checkWebhookService(t, b, d)
		admitted := false
		for _, np := range b.netPols {
			if !selects(&np.Spec.PodSelector, d.Spec.Template.Labels) {
				continue
			}
			admitted = admitted || admitsFromOutside(np, port)
		}
		if !admitted {
			t.Errorf("no NetworkPolicy admits ingress to the receiver's port %d from outside", port)
		}
		checkFakeJiraWebhook(t, b, svc)
	})
}

// checkWebhookContainer checks the receiver's container c: its secret from a mounted
// Secret file, no INSECURE_NO_SIGNATURE, the sweep's scope, a container port named http
// on ADDR's port and a /readyz probe. It returns the port.
func checkWebhookContainer(t *testing.T, b *build, c *corev1.Container, spec corev1.PodSpec) int {
	t.Helper()
	env := resolveEnv(t, b, c, spec, "pod")
	if env["WEBHOOK_SECRET"] != "" || envVar(c, "WEBHOOK_SECRET") != nil {
		t.Error("WEBHOOK_SECRET in the environment; mount the Secret and set WEBHOOK_SECRET_FILE")
	}
	if _, ok := secretMount(c, spec, env["WEBHOOK_SECRET_FILE"]); !ok {
		t.Errorf("WEBHOOK_SECRET_FILE %q is not in a mounted Secret", env["WEBHOOK_SECRET_FILE"])
	}
	if env["INSECURE_NO_SIGNATURE"] != "" {
		t.Error("INSECURE_NO_SIGNATURE set")
	}
	if env["JIRA_JQL"] == "" || env["JIRA_TRIGGER_GROUP"] == "" {
		t.Errorf("JIRA_JQL %q, JIRA_TRIGGER_GROUP %q: the receiver applies the sweep's scope and group check", env["JIRA_JQL"], env["JIRA_TRIGGER_GROUP"])
	}
	_, portText, err := net.SplitHostPort(env["ADDR"])
	if err != nil {
		t.Fatalf("ADDR %q", env["ADDR"])
	}
	port, _ := strconv.Atoi(portText)
	var http *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "http" {
			http = &c.Ports[i]
		}
	}
	if http == nil || int(http.ContainerPort) != port {
		t.Fatalf("ADDR %s: no container port named http on %d (%+v)", env["ADDR"], port, c.Ports)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("no /readyz readiness probe (not ready while Redis is down)")
	}
	return port
}

// checkWebhookService: the Service ymirflow-webhook selects the receiver's pods (d) and
// no other Deployment's, with one port named http. It returns the Service.
func checkWebhookService(t *testing.T, b *build, d *appsv1.Deployment) *corev1.Service {
	t.Helper()
	svc := b.services["ymirflow-webhook"]
	if svc == nil || !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, d.Spec.Template.Labels) {
		t.Fatalf("no Service ymirflow-webhook selecting the receiver's pods")
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "http" || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service ports %+v, want one named http to the container port http", svc.Spec.Ports)
	}
	for name, other := range b.deployments {
		if name != d.Name && selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, other.Spec.Template.Labels) {
			t.Errorf("the Service also selects Deployment %s", name)
		}
	}
	return svc
}

// admitsFromOutside reports whether np has an ingress rule open to anyone on port.
func admitsFromOutside(np *networkingv1.NetworkPolicy, port int) bool {
	admitted := false
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && p.Port.IntValue() == port && len(rule.From) == 0 {
				admitted = true
			}
		}
	}
	return admitted
}

// checkFakeJiraWebhook: the dev fake Jira sends its webhooks to the Service svc, signed
// with the same Secret.
func checkFakeJiraWebhook(t *testing.T, b *build, svc *corev1.Service) {
	t.Helper()
	fj := b.deployments["fakejira"]
	if fj == nil {
		return
	}
	fc := &fj.Spec.Template.Spec.Containers[0]
	args := strings.Join(fc.Args, " ")
	if !strings.Contains(args, "--webhook http://ymirflow-webhook:"+strconv.Itoa(int(svc.Spec.Ports[0].Port))+"/") {
		t.Errorf("fakejira args %q do not send webhooks to the Service", args)
	}
	fenv := resolveEnv(t, b, fc, fj.Spec.Template.Spec, "fakejira")
	if _, ok := secretMount(fc, fj.Spec.Template.Spec, fenv["WEBHOOK_SECRET_FILE"]); !ok {
		t.Errorf("fakejira WEBHOOK_SECRET_FILE %q is not in a mounted Secret", fenv["WEBHOOK_SECRET_FILE"])
	}
}

// The Ingress example points at the receiver's Service and port.
func TestWebhookIngressExample(t *testing.T) {
	t.Parallel()
	b := get(t, "base")
	svc := b.services["ymirflow-webhook"]
	raw, err := os.ReadFile("examples/webhook-ingress.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var ing networkingv1.Ingress
	strict, err := sigsjson.UnmarshalStrict(js, &ing)
	if err != nil || len(strict) > 0 || ing.Kind != "Ingress" {
		t.Fatalf("examples/webhook-ingress.yaml: %v %v", err, strict)
	}
	for _, r := range ing.Spec.Rules {
		for _, p := range r.HTTP.Paths {
			be := p.Backend.Service
			if be == nil || be.Name != svc.Name || be.Port.Name != svc.Spec.Ports[0].Name {
				t.Errorf("backend %+v, want Service %s port %s", p.Backend, svc.Name, svc.Spec.Ports[0].Name)
			}
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"examples/webhook-ingress.yaml", "X-Hub-Signature", "JQL", "jira:issue_updated", "ymirflow-webhook"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not explain the webhook registration: no %q", want)
		}
	}
}
