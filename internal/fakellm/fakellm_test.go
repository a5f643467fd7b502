package fakellm_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/fakellm"
)

func TestChargesEachCallAndFails(t *testing.T) {
	s := fakellm.New(fakellm.Options{CostUSD: 0.25})
	url, err := s.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	call := func() *http.Response {
		resp, err := http.Post(url+"/v1/complete", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := call()
	var a fakellm.Answer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || a.CostUSD != 0.25 || a.TokensIn != 1000 {
		t.Fatalf("%+v %v", a, err)
	}
	resp.Body.Close()
	s.FailNext(1, 2)
	if resp := call(); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if s.Calls() != 1 || s.Spent() != 0.25 {
		t.Fatalf("calls %d spent %v", s.Calls(), s.Spent())
	}
	if resp, _ := http.Post(url+"/v1/complete", "application/json", strings.NewReader(`{}`)); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no model: %d", resp.StatusCode)
	}
}
