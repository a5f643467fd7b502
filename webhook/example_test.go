package webhook_test

import (
	"fmt"

	"github.com/ymirflow/ymirflow/webhook"
)

// Jira signs a delivery with the webhook's secret; the receiver recomputes the same value.
func ExampleSign() {
	body := []byte(`{"webhookEvent":"jira:issue_updated","issue":{"key":"RHEL-1"}}`)
	fmt.Println(webhook.Sign([]byte("s3cret"), body)[:15])
	// Output: sha256=0a8cc83f
}
